#!/usr/bin/env python3
"""Validates JSON texts against a JSON Schema with the jsonschema package (Debian's
python3-jsonschema), independently of kvvm's grammar: the schema compiler's samples are
checked here.

Usage: validate_json.py FILE, FILE holding {"schema": ..., "instances": ["<json text>", ...]}.
Prints one line per instance that is not valid JSON or not valid against the schema.
Exit status: 0 all valid, 1 some invalid, 2 jsonschema missing or bad input.

Formats are checked by the functions below (written from RFC 3339, RFC 4122 and a plain
reading of an address), not by the package's optional format dependencies, so that every
format the compiler writes is checked on any machine.
"""
import datetime
import json
import re
import sys

try:
    import jsonschema
except ImportError:
    print("validate_json.py: the python3 module jsonschema is missing "
          "(apt-get install python3-jsonschema)", file=sys.stderr)
    sys.exit(2)

FORMATS = jsonschema.FormatChecker(formats=())

_TIME = re.compile(r"^(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|z|[+-](\d{2}):(\d{2}))$")


@FORMATS.checks("date")
def _date(text):
    if not isinstance(text, str):
        return True
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return False
    try:
        datetime.date(int(text[:4]), int(text[5:7]), int(text[8:]))
    except ValueError:
        return False
    return True


@FORMATS.checks("time")
def _time(text):
    if not isinstance(text, str):
        return True
    m = _TIME.match(text)
    if not m:
        return False
    hour, minute, second = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if hour > 23 or minute > 59 or second > 60:
        return False
    if m.group(6) is not None and (int(m.group(6)) > 23 or int(m.group(7)) > 59):
        return False
    return True


@FORMATS.checks("date-time")
def _date_time(text):
    if not isinstance(text, str):
        return True
    parts = re.split("[Tt]", text, maxsplit=1)
    return len(parts) == 2 and _date(parts[0]) and _time(parts[1])


@FORMATS.checks("uuid")
def _uuid(text):
    if not isinstance(text, str):
        return True
    return re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", text) is not None


@FORMATS.checks("email")
def _email(text):
    if not isinstance(text, str):
        return True
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain:
        return False
    atom = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
    label = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
    return (re.fullmatch(atom + r"(\." + atom + r")*", local) is not None and
            re.fullmatch(label + r"(\." + label + r")*", domain) is not None)


def _readings(text):
    """The values of `text`, one per occurrence of a duplicated key (JSON allows duplicates;
    a reader keeps one of them): reading k keeps each key's k-th occurrence (its last when it
    has fewer), so every duplicate's value is validated in some reading."""
    most = [1]

    def count(pairs):
        seen = {}
        for k, _ in pairs:
            seen[k] = seen.get(k, 0) + 1
        most[0] = max([most[0], *seen.values()])
        return dict(pairs)

    values = [json.loads(text, object_pairs_hook=count)]
    if most[0] > 1:
        values = []
    for k in range(most[0] if most[0] > 1 else 0):
        def pick(pairs, k=k):
            occurrences = {}
            for key, value in pairs:
                occurrences.setdefault(key, []).append(value)
            return {key: vs[min(k, len(vs) - 1)] for key, vs in occurrences.items()}
        values.append(json.loads(text, object_pairs_hook=pick))
    return values


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    validator = jsonschema.Draft202012Validator(data["schema"], format_checker=FORMATS)
    bad = 0
    for i, text in enumerate(data["instances"]):
        try:
            values = _readings(text)
        except ValueError as e:
            print(f"instance {i}: not JSON ({e}): {text}")
            bad += 1
            continue
        errors = [e for value in values for e in validator.iter_errors(value)]
        if errors:
            print(f"instance {i}: {errors[0].message}: {text}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
