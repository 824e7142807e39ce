"""Regenerate long_prompt.jsonl: three ~1,500-token prompts with short answers (prefill dominates).

    python bench/workloads/make_long_prompt.py

Deterministic (seeded): the shipped file is exactly what this writes.
"""

from __future__ import annotations

import json
import pathlib
import random

REPORT = """Incident report: checkout service outage

Summary. On the morning of the incident, customers of the online store could browse products but could not complete
a purchase for about two hours. The checkout page returned an error after the customer confirmed the payment
details. No payments were charged twice, and no customer data was lost. This report describes what happened, why it
happened, how the team responded, and what will change so that it does not happen again.

Background. The checkout service is a small web application that receives the contents of a basket, asks the
pricing service for the final price, reserves the items with the inventory service, and then sends the payment to an
external payment provider. Each of these steps is a network call. The checkout service keeps a pool of database
connections to record orders. The pool has a fixed size of fifty connections per instance, and there are normally
six instances running behind a load balancer. The database is a single primary server with two read replicas.

Timeline. At 08:02 a scheduled job started to rebuild the search index. The job had been moved the week before from
a separate database to the main order database, to save money. At 08:09 the first alerts fired: the error rate of
the checkout service rose above two percent. At 08:14 the on-call engineer acknowledged the alert and looked at the
dashboards. The error rate kept rising and reached forty percent at 08:25. The engineer saw that requests to the
checkout service were timing out while waiting for a database connection. At 08:31 the engineer added four more
instances of the checkout service, expecting more capacity to help. It made the problem worse: each new instance
opened fifty more connections, and the database reached its limit of connections at 08:36. From that moment almost
every checkout failed. At 08:44 the incident was escalated, and a database specialist joined the call. At 09:05 the
specialist found the search index job holding long transactions and locks on the orders table. At 09:12 the job
was stopped. The locks were released within a minute, but the checkout service did not recover, because the extra
instances still held most of the connections and many of them were stuck in a broken state. At 09:40 the team
restarted the checkout instances one by one and reduced their number back to six. At 09:58 the error rate returned
to normal. The incident was declared over at 10:15 after fifteen minutes without errors.

Impact. About eleven thousand checkout attempts failed. Roughly a third of those customers tried again later the
same day and completed their purchase. Customer support received about nine hundred messages. The estimated lost
revenue is between forty and sixty thousand dollars. There was no security impact.

Root cause. The direct cause was the search index job. It read the whole orders table in one long transaction and
took locks that blocked the inserts made by the checkout service. The job had run safely for months on its own
database. When it was moved to the main order database, nobody reviewed how it used transactions, and the change
was not tested with production traffic. The contributing causes were the fixed connection pool without a timeout
for waiting requests, the lack of a limit on the total number of connections that all instances may open together,
and a runbook that suggested adding instances whenever latency rises.

What went well. The alerts fired within seven minutes of the start. The payment provider integration behaved
correctly: no customer was charged for a failed order, because payments are only captured after the order is
recorded. The team communicated clearly on the status page every twenty minutes.

What went poorly. The first response, adding instances, made the outage worse and longer. It took more than an hour
to find the job that held the locks, because the database dashboards did not show long transactions or lock waits.
The job had no owner listed, so nobody knew that it had moved. The restart of the checkout instances took almost
twenty minutes because it was done by hand.

Action items. First, move the search index job back to a replica, and make it read in small batches with short
transactions. Owner: the search team; due in one week. Second, add a connection timeout of two seconds to the
checkout service pool, so that requests fail fast instead of piling up. Owner: the checkout team; due in one week.
Third, put a connection proxy in front of the database that caps the total number of connections at three hundred.
Owner: the database team; due in one month. Fourth, add dashboards and alerts for long transactions and lock waits.
Owner: the database team; due in two weeks. Fifth, update the runbook: before adding instances, check the database
connections and locks. Owner: the on-call lead; due in one week. Sixth, require an owner and a review for every
scheduled job that touches the order database. Owner: the platform team; due in one month. Seventh, automate rolling
restarts of the checkout service. Owner: the checkout team; due in one month.

Lessons. Moving a job between databases is a production change and needs the same review as a code change. Adding
capacity is not always the right response to latency: when the bottleneck is a shared resource, more clients make
it worse. Every limit in the system should be explicit and visible, from the pool size of one instance to the total
number of connections the database accepts. Finally, dashboards should show the resources that can run out, not
only the symptoms that customers see.

Appendix: measurements. Before the incident, the checkout service handled about one hundred and twenty requests per
second at peak, with a median latency of one hundred and eighty milliseconds and a ninety-ninth percentile of six
hundred milliseconds. The database served about two thousand queries per second, with an average of two hundred and
ten open connections. During the incident, the number of open connections reached the maximum of five hundred, the
median latency of the checkout service rose to thirty seconds, which is its request timeout, and the database
reported more than four thousand lock waits per minute. After recovery, all figures returned to their usual values
within ten minutes. The search index job, when it ran on its own database, needed about forty minutes and read
about sixty million rows. On the main database it ran for seventy minutes before it was stopped, and it had read
about two thirds of the table.
"""


def inventory_csv(rng: random.Random, rows: int = 60) -> str:
    items = ["mug", "lamp", "notebook", "chair", "desk", "cable", "charger", "headphones", "keyboard", "mouse",
             "monitor", "backpack", "bottle", "pen", "stapler", "speaker", "camera", "tripod", "router", "printer"]
    colors = ["red", "blue", "black", "white", "green", "grey", "yellow"]
    lines = ["sku,name,color,warehouse,quantity,unit_price_usd"]
    for i in range(rows):
        lines.append(f"S-{1000 + i},{rng.choice(items)},{rng.choice(colors)},{rng.choice(['north', 'south', 'east'])},"
                     f"{rng.randint(0, 400)},{rng.randint(199, 19999) / 100:.2f}")
    return "\n".join(lines)


def server_log(rng: random.Random, lines: int = 40) -> str:
    events = [
        ("INFO", "request completed path=/api/orders status=200 duration_ms={}"),
        ("INFO", "request completed path=/api/products status=200 duration_ms={}"),
        ("WARN", "slow query table=orders duration_ms={}"),
        ("ERROR", "database connection refused host=db-primary attempt={}"),
        ("INFO", "cache hit ratio={}"),
        ("ERROR", "payment provider timeout after_ms={}"),
        ("INFO", "user login user_id={}"),
    ]
    out = []
    for i in range(lines):
        level, text = rng.choice(events)
        out.append(f"2024-05-14T09:{i // 60:02d}:{i % 60:02d}Z {level:5s} {text.format(rng.randint(1, 5000))}")
    return "\n".join(out)


def main() -> None:
    rng = random.Random(7)
    prompts = [
        {"id": "incident_report", "max_tokens": 32,
         "prompt": REPORT + "\nIn one sentence: what was the root cause of the outage?"},
        {"id": "inventory_csv", "max_tokens": 32,
         "prompt": "Here is an inventory table in CSV.\n\n" + inventory_csv(rng)
         + "\n\nWhich warehouse appears most often in the table? Answer in one short sentence."},
        {"id": "server_log", "max_tokens": 32,
         "prompt": "Here is an excerpt of a server log.\n\n" + server_log(rng)
         + "\n\nIn one sentence: what kinds of errors does this log show?"},
    ]
    path = pathlib.Path(__file__).with_name("long_prompt.jsonl")
    with path.open("w") as handle:
        for item in prompts:
            handle.write(json.dumps(item) + "\n")


if __name__ == "__main__":
    main()
