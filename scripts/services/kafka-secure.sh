#!/usr/bin/env bash
# The secure broker of kafka.sh, under the name services.sh and the tests use.
exec bash "$(dirname "${BASH_SOURCE[0]}")/kafka.sh" --secure "$@"
