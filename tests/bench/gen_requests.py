#!/usr/bin/env python3
"""Writes N System One requests as `key<TAB>json` lines for `kcat -P -K'\t'`.

A mix like a ticket-routing stream: short states (a sentence or two), one to
three questions per request (choice, noul, score), a third of the requests
asking several questions about one state (the scheduler shares its prefix).
Deterministic for a given seed, so two runs send the same bytes.

    tests/bench/gen_requests.py N [SEED] [--invalid] [--repeats F] > requests.tsv

--invalid makes every request fail validation (each choice has one option:
a 400 without the engine), to measure the stream path alone: consume,
decode, validate, encode, produce, commit.

--repeats F (0 <= F < 1): each request after the first repeats, with
probability F, an earlier request of the run chosen at random (its body byte
for byte, under its own key); every other request is new: its state starts
with a ticket number, so that two new ones never share a question. Without
it the states are drawn from 500 and repeat as they happen to.
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


def request(rng, invalid, ticket=None):
    st = state(rng) if ticket is None else f"Ticket {ticket}. {state(rng)}"
    if invalid:
        return {"state": st, "questions": {"team": {
            "type": "choice", "criteria": {"billing": "Payments and invoices"}}}}
    n = 1 if rng.random() < 0.67 else rng.choice([2, 3])
    kinds = rng.sample(["choice", "noul", "score"], n)
    return {"state": st, "questions": {k: question(rng, k) for k in kinds}}


def main():
    argv = sys.argv[1:]
    repeats = None
    if "--repeats" in argv:
        k = argv.index("--repeats")
        repeats = float(argv[k + 1])
        del argv[k:k + 2]
        if not 0 <= repeats < 1:
            sys.exit("gen_requests.py: --repeats F needs 0 <= F < 1")
    args = [a for a in argv if a != "--invalid"]
    invalid = len(args) != len(argv)
    n = int(args[0])
    rng = random.Random(int(args[1]) if len(args) > 1 else 1)
    out = sys.stdout
    bodies = []
    for i in range(n):
        if repeats is not None and bodies and rng.random() < repeats:
            body = rng.choice(bodies)
        else:
            body = json.dumps(request(rng, invalid, None if repeats is None else i),
                              separators=(',', ':'))
            bodies.append(body)
        out.write(f"req-{i:07d}\t{body}\n")


if __name__ == "__main__":
    main()
