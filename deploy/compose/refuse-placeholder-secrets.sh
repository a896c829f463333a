#!/bin/sh
# Entry point wrapper of the compose services that hold a password (docker-compose.yml: timescaledb and
# grafana). It refuses to start while one of the named variables is empty or still a placeholder, with a
# line naming the variable, then runs the image's own entry point:
#
#   sh refuse-placeholder-secrets.sh VAR [VAR...] -- ENTRYPOINT [ARG...]
#
# Compose's ${VAR:?...} already stops `docker compose up` on an unset or empty value; this catches the
# values that interpolation accepts: a .env copied from an older .env.example (change-me, change-me-too)
# and Grafana's well-known default (admin). It never prints a value.
refused=0
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    name=$1
    shift
    case $name in
        '' | [0-9]* | *[!A-Za-z0-9_]*)
            echo "refuse-placeholder-secrets: '$name' is not a variable name" >&2
            exit 64
            ;;
    esac
    eval "value=\${$name-}"
    lowered=$(printf '%s' "$value" | tr '[:upper:]' '[:lower:]')
    case $lowered in
        '')
            echo "refusing to start: $name is empty; set it in .env" >&2
            refused=1
            ;;
        change-me* | changeme* | change_me* | admin | password | secret)
            echo "refusing to start: $name is still a placeholder; set a real password in .env" >&2
            refused=1
            ;;
    esac
done
if [ "$#" -eq 0 ]; then
    echo "refuse-placeholder-secrets: usage: VAR [VAR...] -- ENTRYPOINT [ARG...]" >&2
    exit 64
fi
shift
if [ "$refused" -ne 0 ]; then
    exit 1
fi
unset name value lowered refused
exec "$@"
