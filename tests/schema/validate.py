#!/usr/bin/env python3
"""Validate JSON documents against a JSON Schema whose $refs are files of
the same directory (the OCI runtime-spec schemas are draft-04).

usage: validate.py SCHEMA_DIR SCHEMA_FILE DOC...

Prints one line per document, `valid PATH` or `invalid PATH: reason`; exits
0 when every document was checked, 2 on a usage or setup error. No network:
only files under SCHEMA_DIR are resolved. Works with python3-jsonschema 4.10
(Debian bookworm) and newer.
"""
import json
import pathlib
import sys

import jsonschema


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    schema_dir = pathlib.Path(sys.argv[1]).resolve()
    base = schema_dir.as_uri() + "/"
    schema = json.loads((schema_dir / sys.argv[2]).read_text())
    store = {}
    for f in schema_dir.glob("*.json"):
        store[base + f.name] = json.loads(f.read_text())
    resolver = jsonschema.RefResolver(base_uri=base + sys.argv[2], referrer=schema, store=store)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft4Validator)
    validator = cls(schema, resolver=resolver)
    for doc in sys.argv[3:]:
        try:
            instance = json.loads(pathlib.Path(doc).read_text())
        except ValueError as e:
            print(f"invalid {doc}: not JSON: {e}")
            continue
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.absolute_path)
            print(f"invalid {doc}: at /{where}: {e.message}")
        else:
            print(f"valid {doc}")
    return 0


sys.exit(main())
