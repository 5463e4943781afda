"""hello-agent: reads the user registry and writes a one-line report.

Usage: main.py OUTPUT_PATH
"""
import csv
import sys

with open("registries/users.csv", newline="") as f:
    users = list(csv.DictReader(f))

with open(sys.argv[1], "w") as out:
    out.write(f"{len(users)} users: {', '.join(u['name'] for u in users)}\n")
