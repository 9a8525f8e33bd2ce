#!/usr/bin/env bash
# Fresh machine -> a trained tiny code model + runs/<name>/report.md. Arguments go to `codechat speedrun`.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" grammar  # the function-calling stage also scores strict calls
exec "$VPY" -m codechat speedrun "$@"
