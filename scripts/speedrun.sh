#!/usr/bin/env bash
# Fresh machine -> a trained tiny code model + runs/<name>/report.md. Arguments go to `codechat speedrun`.
# The serve extra: `codechat serve` works on the trained model next, and its llguidance lets the
# function-calling stage also score strict calls.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" serve
exec "$VPY" -m codechat speedrun "$@"
