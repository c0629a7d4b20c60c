#!/usr/bin/env bash
# The secure Redis of redis.sh, under the name services.sh and the tests use.
exec bash "$(dirname "${BASH_SOURCE[0]}")/redis.sh" --secure "$@"
