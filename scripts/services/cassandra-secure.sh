#!/usr/bin/env bash
# The secure node of cassandra.sh, under the name services.sh and the tests use.
exec bash "$(dirname "${BASH_SOURCE[0]}")/cassandra.sh" --secure "$@"
