# hello-shell: hello-agent's main.py for an image without python (the
# Kubernetes example runs it in busybox): reads the user registry and
# writes the same one-line report, with shell builtins only, so the turn
# executes nothing but the shell its execute entry names. A package of its
# own: an execute entry whose program is missing (python3 in busybox)
# makes the whole manifest refused (TS1007), so hello-agent's cannot
# serve both.
#
# Usage: /bin/sh installed/hello-shell/hello.sh OUTPUT_PATH
set -eu
count=0
names=
{
    read -r _header
    while IFS=, read -r _id name; do
        count=$((count + 1))
        names="${names:+$names, }$name"
    done
} < registries/users.csv
echo "$count users: $names" > "$1"
