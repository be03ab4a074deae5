#!/usr/bin/env python3
"""Writes N System One requests as `key<TAB>json` lines for `kcat -P -K'\t'`.

A mix like a ticket-routing stream: short states (a sentence or two), one to
three questions per request (choice, noul, score), a third of the requests
asking several questions about one state (the scheduler shares its prefix).
Deterministic for a given seed, so two runs send the same bytes.

    tests/bench/gen_requests.py N [SEED] [--invalid] > requests.tsv

--invalid makes every request fail validation (each choice has one option:
a 400 without the engine), to measure the stream path alone: consume,
decode, validate, encode, produce, commit.
"""
import json
import random
import sys

SUBJECTS = ["invoice", "parcel", "password", "subscription", "refund", "login",
            "delivery", "warranty", "account", "order"]
PROBLEMS = ["was charged twice", "arrived damaged", "cannot be reset",
            "renewed without notice", "is still pending", "fails with an error",
            "is three days late", "was refused", "got locked", "shows the wrong items"]
MOODS = ["Please help.", "This is urgent.", "Thanks in advance.", "Very disappointed.", ""]


def state(rng):
    s = f"Customer writes: my {rng.choice(SUBJECTS)} {rng.choice(PROBLEMS)}. {rng.choice(MOODS)}"
    return s.strip()


def question(rng, kind):
    if kind == "choice":
        return {"type": "choice", "instructions": "Which team should handle this?",
                "criteria": {"billing": "Payments and invoices", "logistics": "Shipping",
                             "tech": "Accounts and errors", "general": None}}
    if kind == "noul":
        return {"type": "noul", "instructions": "Is this urgent?"}
    return {"type": "score", "instructions": "How upset is the customer?",
            "criteria": ["Calm", "Annoyed", "Angry"]}


def request(rng, invalid):
    if invalid:
        return {"state": state(rng), "questions": {"team": {
            "type": "choice", "criteria": {"billing": "Payments and invoices"}}}}
    n = 1 if rng.random() < 0.67 else rng.choice([2, 3])
    kinds = rng.sample(["choice", "noul", "score"], n)
    return {"state": state(rng), "questions": {k: question(rng, k) for k in kinds}}


def main():
    args = [a for a in sys.argv[1:] if a != "--invalid"]
    invalid = len(args) != len(sys.argv) - 1
    n = int(args[0])
    rng = random.Random(int(args[1]) if len(args) > 1 else 1)
    out = sys.stdout
    for i in range(n):
        body = json.dumps(request(rng, invalid), separators=(',', ':'))
        out.write(f"req-{i:07d}\t{body}\n")


if __name__ == "__main__":
    main()
