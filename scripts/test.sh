#!/usr/bin/env bash
# Fresh machine -> the whole test suite. Arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" test
exec "$VPY" -m pytest -q -ra "$@"
