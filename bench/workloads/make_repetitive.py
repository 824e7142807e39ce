"""Write the repetitive workloads: extraction, agent_loop, sql and faq (.jsonl beside this file).

    python bench/workloads/make_repetitive.py

Each is a sequence of requests played in order, shaped like production traffic that repeats itself:
- extraction: 24 different short records (invoices, people, products, orders, events), one fixed
  JSON schema in every prompt: the output frame repeats, the values change;
- agent_loop: a fixed system prompt with tool definitions; 5 tasks of 4 turns each, each request
  the conversation so far (earlier tool calls and their results), the answer the next tool call
  as JSON;
- sql: one shared schema, 22 questions;
- faq: a support bot's fixed facts, 24 questions with exact repeats and near-duplicates;
and one more, not in the default run (bench.core.workloads.EXTRA_WORKLOADS):
- function_calling: an assistant with 6 tools, 24 requests, each answered with one call
  {"name": TOOL, "arguments": {...}}.
The lines of extraction, agent_loop and function_calling carry a "schema": the JSON Schema of the answer
(structured outputs; a tool call's arguments constrained by the tool's schema). Everything is fixed text (no
randomness); a test checks the shipped files are what this writes.
"""

from __future__ import annotations

import json
import pathlib

# --- extraction --------------------------------------------------------------------------------------------------

EXTRACTION_SCHEMA = ('{"kind": "invoice" | "person" | "product" | "order" | "event", "name": string, '
                     '"date": "YYYY-MM-DD" | null, "amount": number | null, "currency": "ISO 4217 code" | null, '
                     '"city": string | null, "email": string | null}')
EXTRACTION_EXAMPLE = ('Record: Invoice 12 from Blue Ltd, Leeds, 5 January 2024, 99.00 GBP.\n'
                      'JSON: {"kind": "invoice", "name": "Blue Ltd", "date": "2024-01-05", "amount": 99.0, '
                      '"currency": "GBP", "city": "Leeds", "email": null}')
EXTRACTION_INSTRUCTION = ("Extract the record into one line of JSON. Use exactly this schema and key order, null "
                          "for anything the record does not say, and output only the JSON.\n\nSchema: "
                          + EXTRACTION_SCHEMA + "\n\nExample:\n" + EXTRACTION_EXAMPLE + "\n\nRecord: ")
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
# The prompts' schema ("Use exactly this schema and key order"), as a JSON Schema.
EXTRACTION_JSON_SCHEMA = {
    "type": "object", "properties": {
        "kind": {"enum": ["invoice", "person", "product", "order", "event"]}, "name": {"type": "string"},
        "date": _NULLABLE_STRING, "amount": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "currency": _NULLABLE_STRING, "city": _NULLABLE_STRING, "email": _NULLABLE_STRING},
    "required": ["kind", "name", "date", "amount", "currency", "city", "email"], "additionalProperties": False}
EXTRACTION_RECORDS = [
    ("invoice_nordlicht", "Invoice INV-2024-0113 from Nordlicht GmbH, Hamburg, dated 12 March 2024: 1,250.00 EUR "
                          "due within 30 days. Questions to billing@nordlicht.de."),
    ("person_gonzalez", "Maria Gonzalez, 34, moved to Valencia on 2023-09-01. You can reach her at "
                        "maria.gonzalez@example.es."),
    ("product_aurora", "The Aurora X2 desk lamp costs $89.99 and ships from our Portland warehouse. Support: "
                       "lamps@aurora-home.com."),
    ("order_watanabe", "Order #55821 placed on 5 January 2024 by Kenji Watanabe (kenji.w@example.jp) in Osaka, "
                       "total 12,800 JPY."),
    ("event_pycon", "PyCon Nordic takes place in Oslo on 2024-06-18; tickets are 350 NOK. Contact: "
                    "hello@pyconnordic.no."),
    ("invoice_greenfield", "Invoice 7781 - Greenfield Farms Ltd, Cork - 2024-04-02 - EUR 318.40 - "
                           "accounts@greenfield.ie"),
    ("person_okafor", "Dr. Amara Okafor joined Lagos University Teaching Hospital on 14 July 2022; email "
                      "a.okafor@luth.ng."),
    ("product_trailrunner", "The TrailRunner 5 running shoe is listed at 120 GBP in the Manchester store from "
                            "1 May 2024."),
    ("order_brown", "Order 9001 by Olivia Brown, Sydney, on 2024-05-07, total AUD 156.30, olivia.b@example.com.au."),
    ("event_mlsummit", "ML Summit Toronto, September 9, 2024, early-bird tickets CAD 499, info@mlsummit.ca."),
    ("invoice_sakura", "Invoice from Sakura Design (Kyoto) dated 2024-01-20 for JPY 85,000; send remittance to "
                       "pay@sakura-design.jp."),
    ("person_novak", "Lukas Novak, software engineer in Prague, born 1991-11-23, lukas.novak@example.cz."),
    ("product_nimbus", "Nimbus 2-person tent, 3.2 kg, price 249 EUR, available in our Munich shop."),
    ("order_chen", "Order A-4410 placed 2024-06-30 in Toronto by Emily Chen (emily.chen@example.ca), total CAD "
                   "89.00."),
    ("invoice_cascade", "Invoice INV-88 from Cascade Plumbing, Seattle, 2023-12-11, $640.00, "
                        "office@cascadeplumbing.com."),
    ("person_raman", "Priya Raman lives in Bangalore and can be contacted at priya.raman@example.in."),
    ("event_rustberlin", "Rust Berlin meetup, 2024-02-15, free entry, hosted at c-base, contact rust@berlin.dev."),
    ("product_orbit", "The Orbit smartwatch retails for 199 CHF in Zurich; press contact press@orbitwear.ch."),
    ("invoice_rossi", "Invoice 2024/317, Rossi & Figli S.r.l., Milan, 2024-07-15, EUR 2,980.00, "
                      "amministrazione@rossifigli.it."),
    ("person_hassan", "Ahmed Hassan, accountant, has worked in the Cairo office since 2020-03-01; "
                      "ahmed.hassan@example.eg."),
    ("order_silva", "Order 3310 from Ana Silva in Lisbon, 2024-03-02, 47.50 EUR, ana.silva@example.pt."),
    ("event_gala", "Charity gala in Edinburgh on 23 November 2024, tables from 1,500 GBP; "
                   "bookings@galaedinburgh.org.uk."),
    ("product_kettle", "Stainless steel kettle KT-200, 1.7 litres, 39.90 EUR, sold by our Vienna store."),
    ("person_petrova", "Sofia Petrova, a translator based in Sofia, Bulgaria; write to sofia.petrova@example.bg."),
]

# --- agent loop --------------------------------------------------------------------------------------------------

AGENT_SYSTEM = (
    "You are an order-support agent. Answer every message with exactly one tool call as JSON, "
    '{"tool": NAME, "arguments": {...}}, and nothing else. Tools:\n'
    "- find_customer(email): the customer's id and name\n"
    "- list_orders(customer_id): the customer's recent orders\n"
    "- get_order(order_id): an order's items, status and total\n"
    "- refund(order_id, amount, reason): refund part or all of an order\n"
    "- send_email(to, subject, body): email the customer\n"
    "- finish(summary): end the task")




def _object(**properties) -> dict:
    """A JSON Schema object with exactly these properties, all required, in this order."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


STRING, INTEGER, NUMBER = {"type": "string"}, {"type": "integer"}, {"type": "number"}
# Each tool's arguments, as the system prompt lists them.
AGENT_TOOLS = {
    "find_customer": _object(email=STRING), "list_orders": _object(customer_id=INTEGER),
    "get_order": _object(order_id=INTEGER), "refund": _object(order_id=INTEGER, amount=NUMBER, reason=STRING),
    "send_email": _object(to=STRING, subject=STRING, body=STRING), "finish": _object(summary=STRING)}


def tool_call_schema(tools: dict[str, dict], name_key: str) -> dict:
    """One call of one of the tools: {name_key: TOOL, "arguments": ARGS}, ARGS by that tool's schema."""
    return {"anyOf": [_object(**{name_key: {"const": name}, "arguments": arguments})
                      for name, arguments in tools.items()]}


def call(tool: str, **arguments) -> str:
    return json.dumps({"tool": tool, "arguments": arguments})


def result(**fields) -> str:
    return "Tool result: " + json.dumps(fields)


# One scripted turn each: (the tool call, its result).
def found(email: str, customer_id: int, name: str) -> tuple[str, str]:
    return call("find_customer", email=email), result(customer_id=customer_id, name=name)


def listed(customer_id: int, *orders: tuple[int, str]) -> tuple[str, str]:
    return call("list_orders", customer_id=customer_id), result(
        orders=[{"order_id": order_id, "date": date} for order_id, date in orders])


def order(order_id: int, status: str, total: float, *items: str) -> tuple[str, str]:
    return call("get_order", order_id=order_id), result(order_id=order_id, status=status, total=total,
                                                        items=list(items))


def refunded(order_id: int, amount: float, reason: str, refund_id: str) -> tuple[str, str]:
    return call("refund", order_id=order_id, amount=amount, reason=reason), result(refund_id=refund_id,
                                                                                   status="approved")


def emailed(to: str, subject: str, body: str) -> tuple[str, str]:
    return call("send_email", to=to, subject=subject, body=body), result(sent=True)


# A fixed demonstration at the start of every conversation (few-shot, as agent prompts do): without it the
# 135M model answers a task's first turn in prose.
AGENT_DEMO = [
    {"role": "user", "content": "Close the ticket of jo@example.com: nothing to do."},
    {"role": "assistant", "content": '{"tool": "find_customer", "arguments": {"email": "jo@example.com"}}'},
    {"role": "user", "content": 'Tool result: {"customer_id": 7, "name": "Jo Park"}'},
    {"role": "assistant", "content": '{"tool": "finish", "arguments": {"summary": "Nothing to do for Jo Park."}}'},
]

# (id, task, 4 scripted turns): request t is the demo, the task and turns 0..t-1.
AGENT_TASKS = [
    ("broken_kettle", "Customer ana.silva@example.pt says order 3310 arrived broken. Refund it and tell her.", [
        found("ana.silva@example.pt", 311, "Ana Silva"),
        order(3310, "delivered", 47.5, "kettle"),
        refunded(3310, 47.5, "arrived broken", "R-881"),
        emailed("ana.silva@example.pt", "Refund for order 3310", "We refunded 47.50 EUR for your broken kettle."),
    ]),
    ("where_is_order", "Where is the latest order of tom.reed@example.org? Tell him its status.", [
        found("tom.reed@example.org", 518, "Tom Reed"),
        listed(518, (4102, "2024-06-02"), (3987, "2024-05-11")),
        order(4102, "shipped", 129.0, "headphones"),
        emailed("tom.reed@example.org", "Status of order 4102", "Your order 4102 has shipped."),
    ]),
    ("shipping_fee", "Refund the 4.99 shipping fee on the last order of li.wei@example.cn.", [
        found("li.wei@example.cn", 702, "Li Wei"),
        listed(702, (5120, "2024-06-20")),
        refunded(5120, 4.99, "shipping fee", "R-902"),
        emailed("li.wei@example.cn", "Refund for order 5120", "We refunded the 4.99 EUR shipping fee."),
    ]),
    ("what_did_i_order", "omar.k@example.net asks what he ordered in May. Email him the items.", [
        found("omar.k@example.net", 845, "Omar Khalil"),
        listed(845, (3991, "2024-05-14")),
        order(3991, "delivered", 58.0, "phone case", "charger"),
        emailed("omar.k@example.net", "Your May order 3991", "In May you ordered a phone case and a charger."),
    ]),
    ("late_delivery", "Order 4410 of emily.chen@example.ca is late. Check it, refund 10 EUR, and close the task.", [
        order(4410, "delayed", 89.0, "lamp"),
        refunded(4410, 10.0, "late delivery", "R-915"),
        emailed("emily.chen@example.ca", "Order 4410 is delayed", "Sorry for the delay: we refunded 10 EUR."),
        (call("finish", summary="Refunded 10 EUR on delayed order 4410 and told the customer."), result(done=True)),
    ]),
]

# --- function calling --------------------------------------------------------------------------------------------

FC_TOOLS = {
    "get_weather": _object(city=STRING, unit={"enum": ["celsius", "fahrenheit"]},
                           days={"type": "integer", "minimum": 1, "maximum": 7}),
    "book_flight": _object(origin=STRING, destination=STRING, date=STRING,
                           passengers={"type": "integer", "minimum": 1, "maximum": 9},
                           cabin={"enum": ["economy", "premium", "business"]}),
    "set_reminder": _object(text=STRING, time=STRING, repeat={"enum": ["none", "daily", "weekly"]}),
    "convert_currency": _object(amount=NUMBER, source=STRING, target=STRING),
    "send_message": _object(recipient=STRING, channel={"enum": ["sms", "email", "slack"]}, body=STRING),
    "find_restaurant": _object(city=STRING, cuisine=STRING, max_price={"type": "integer", "minimum": 1, "maximum": 4},
                               open_now={"type": "boolean"}),
}
FC_SYSTEM = (
    "You are an assistant that acts through tools. Answer every request with exactly one tool call as JSON, "
    '{"name": TOOL, "arguments": {...}}, with the arguments in the order listed, and nothing else. Tools:\n'
    '- get_weather(city: string, unit: "celsius" | "fahrenheit", days: integer 1-7): the forecast\n'
    '- book_flight(origin: string, destination: string, date: "YYYY-MM-DD", passengers: integer 1-9, '
    'cabin: "economy" | "premium" | "business"): book a flight\n'
    '- set_reminder(text: string, time: "YYYY-MM-DD HH:MM", repeat: "none" | "daily" | "weekly"): a reminder\n'
    "- convert_currency(amount: number, source: ISO 4217 code, target: ISO 4217 code): convert money\n"
    '- send_message(recipient: string, channel: "sms" | "email" | "slack", body: string): send a message\n'
    "- find_restaurant(city: string, cuisine: string, max_price: integer 1-4, open_now: boolean): find a place "
    "to eat")
FC_DEMO = [
    {"role": "user", "content": "What will the weather be in Leeds over the next 2 days, in celsius?"},
    {"role": "assistant", "content": json.dumps({"name": "get_weather", "arguments": {
        "city": "Leeds", "unit": "celsius", "days": 2}})},
]
FC_REQUESTS = [
    ("weather_oslo", "Give me the 5-day forecast for Oslo in celsius."),
    ("flight_lisbon", "Book 2 economy seats from London to Lisbon on 2024-09-14."),
    ("reminder_dentist", "Remind me about the dentist on 2024-08-02 at 09:30."),
    ("convert_usd_eur", "How much is 250 US dollars in euros?"),
    ("message_anna", "Text Anna that I'm running 10 minutes late."),
    ("restaurant_rome", "Find a cheap pizza place in Rome that is open now."),
    ("weather_austin", "Will it rain in Austin tomorrow? Use fahrenheit."),
    ("flight_tokyo", "I need a business class ticket from Paris to Tokyo on 2024-11-03, just me."),
    ("reminder_standup", "Set a daily reminder for the team standup at 2024-07-01 10:00."),
    ("convert_gbp_jpy", "Convert 1,200 pounds sterling to Japanese yen."),
    ("message_team", "Post on Slack to the infra team that the deploy is done."),
    ("restaurant_tokyo", "Any sushi restaurant in Tokyo, price level up to 3, open right now?"),
    ("weather_cairo", "What's the weekly forecast for Cairo in celsius?"),
    ("flight_nyc", "Book a premium flight for 3 people from Boston to New York on 2024-10-20."),
    ("reminder_rent", "Remind me to pay the rent on 2024-08-01 at 08:00 every week."),
    ("convert_chf", "What are 75.50 Swiss francs in US dollars?"),
    ("message_boss", "Email my boss, Mr. Lee, that the report is attached."),
    ("restaurant_lyon", "Find an expensive French restaurant in Lyon, it doesn't need to be open now."),
    ("weather_sydney", "Sydney weather for the next 3 days, fahrenheit please."),
    ("flight_madrid", "One economy ticket from Berlin to Madrid on 2024-12-22."),
    ("reminder_call", "Remind me to call mum on 2024-09-05 at 18:00."),
    ("convert_inr", "Convert 10,000 Indian rupees to euros."),
    ("message_sam", "Send Sam an SMS: the keys are under the mat."),
    ("restaurant_delhi", "Find a vegetarian restaurant in Delhi at price level 2 that's open now."),
]

# --- sql -----------------------------------------------------------------------------------------------------------

SQL_SCHEMA = """CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, email TEXT, country TEXT, created_at DATE);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), ordered_at DATE, status TEXT);
CREATE TABLE order_items (order_id INTEGER REFERENCES orders(id), product_id INTEGER REFERENCES products(id), quantity INTEGER, unit_price REAL);"""
SQL_QUESTIONS = [
    ("customers_per_country", "How many customers are there in each country?"),
    ("top_priced_products", "Which 5 products have the highest price?"),
    ("order_revenue", "What is the total revenue of each order?"),
    ("signed_up_2024", "List the names and emails of customers who signed up in 2024."),
    ("shipped_count", "How many orders have the status 'shipped'?"),
    ("avg_price_category", "What is the average price of the products in each category?"),
    ("no_orders", "Which customers have never placed an order?"),
    ("quantity_per_product", "What is the total quantity sold of each product?"),
    ("march_orders", "List the orders placed in March 2024 with the customer's name."),
    ("top_category", "Which category brings in the most revenue?"),
    ("orders_per_customer", "How many orders did each customer place?"),
    ("recent_orders", "What are the 10 most recent orders?"),
    ("never_ordered", "Which products were never ordered?"),
    ("monthly_revenue", "What is the total revenue per month in 2024?"),
    ("german_customers", "List the customers from Germany ordered by name."),
    ("largest_order", "Which order has the largest revenue?"),
    ("distinct_products", "How many distinct products has each customer bought?"),
    ("big_orders", "Which orders contain more than 3 items in total?"),
    ("avg_order_country", "What is the average order revenue per country?"),
    ("cheap_books", "List the products in the 'books' category that cost less than 20."),
    ("cancelled_per_month", "How many orders were cancelled in each month of 2024?"),
    ("top_spender", "Which customer has spent the most in total?"),
]
SQL_INSTRUCTION = "Given this SQLite schema:\n\n" + SQL_SCHEMA + "\n\nWrite one SQL query that answers: "

# --- faq -----------------------------------------------------------------------------------------------------------

FAQ_SYSTEM = (
    "You are the support assistant of Brightline Internet. Answer in one or two sentences, using only these facts:\n"
    "- Support hours: Monday to Friday 8:00-20:00, Saturday 9:00-14:00, closed on Sunday.\n"
    "- Password reset: Settings > Account > Reset password; we email a link within 5 minutes.\n"
    "- Returns: a router can be returned within 30 days with its receipt.\n"
    "- Plans: Basic 100 Mbit/s for 25 EUR a month; Pro 500 Mbit/s for 40 EUR a month.\n"
    "- Outages: check status.brightline.example before calling us.\n"
    "- Moving house: tell us 14 days ahead; moving your line is free.")
# Exact repeats and near-duplicates, interleaved as a support queue sees them.
FAQ_QUESTIONS = [
    "How do I reset my password?",
    "What are your opening hours?",
    "how do i reset my password",
    "Can I return my router?",
    "What are your support hours?",
    "How do I reset my password?",
    "How fast is the Pro plan and how much does it cost?",
    "My internet is down, what should I do?",
    "What are your opening hours?",
    "I forgot my password. How can I reset it?",
    "Can I return the router if I don't like it?",
    "How much is the Basic plan?",
    "I'm moving house, what do I need to do?",
    "How do I reset my password?",
    "Is the internet down right now?",
    "Are you open on Saturday?",
    "Can I return my router?",
    "What plans do you have?",
    "How do I change my password?",
    "I am moving to a new flat next month. What should I do?",
    "What are your opening hours?",
    "How fast is the Pro plan and how much does it cost?",
    "My internet is down, what should I do?",
    "how can i reset my password?",
]


def extraction() -> list[dict]:
    return [{"id": rid, "max_tokens": 72, "prompt": EXTRACTION_INSTRUCTION + text + "\nJSON:",
             "schema": EXTRACTION_JSON_SCHEMA} for rid, text in EXTRACTION_RECORDS]


def agent_loop() -> list[dict]:
    lines = []
    for task_id, task, turns in AGENT_TASKS:
        for t in range(len(turns)):
            messages = [*AGENT_DEMO, {"role": "user", "content": task}]
            for tool_call, tool_result in turns[:t]:
                messages += [{"role": "assistant", "content": tool_call}, {"role": "user", "content": tool_result}]
            lines.append({"id": f"{task_id}_{t + 1}", "max_tokens": 64, "system": AGENT_SYSTEM, "messages": messages,
                          "schema": tool_call_schema(AGENT_TOOLS, "tool")})
    return lines


def function_calling() -> list[dict]:
    return [{"id": rid, "max_tokens": 64, "system": FC_SYSTEM,
             "messages": [*FC_DEMO, {"role": "user", "content": request}],
             "schema": tool_call_schema(FC_TOOLS, "name")} for rid, request in FC_REQUESTS]


def sql() -> list[dict]:
    return [{"id": qid, "max_tokens": 80, "prompt": SQL_INSTRUCTION + question + "\nOutput only the SQL."}
            for qid, question in SQL_QUESTIONS]


def faq() -> list[dict]:
    return [{"id": f"q{i:02d}", "max_tokens": 56, "system": FAQ_SYSTEM, "prompt": question}
            for i, question in enumerate(FAQ_QUESTIONS)]


WORKLOADS = {"extraction": extraction, "agent_loop": agent_loop, "sql": sql, "faq": faq,
             "function_calling": function_calling}


def main() -> None:
    here = pathlib.Path(__file__).resolve().parent
    for name, build in WORKLOADS.items():
        lines = [json.dumps(item, ensure_ascii=False) for item in build()]
        (here / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        print(f"{name}.jsonl: {len(lines)} requests")


if __name__ == "__main__":
    main()
