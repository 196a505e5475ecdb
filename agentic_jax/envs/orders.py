"""A shop's orders: a stateful, conversational tool-use task (tau-bench's retail domain in small).

The agent is a shop's support agent; a simulated customer (``envs.users``) wants ``difficulty``
things done to distinct orders (cancel one, change an item's quantity, change the shipping
address, or be told an order's total) and gives the order id and the other details only when
asked.  The shop is a SQLite database (`SCHEMA`: products with stock, orders, their items)
behind four tools; the rules live in the tools, as a shop's backend enforces them (only pending
orders change, a cancellation restocks, a larger quantity needs stock), and a refused call
returns an ``error: ...`` message the agent can recover from.  Graded by `stateful.GoalState`:
the final database must equal the golden actions' goal state, and a total asked for must have
been told (Yao et al. 2024, arXiv:2406.12045).

Each task is drawn from its seed: the catalogue, the orders, the requests, and each request's
golden actions, applied in turn to a live copy of the initial state (so a later request sees
the stock an earlier one left).  The demonstration is the golden agent's conversation with the
`RuleUser`: it asks for a request's details in one question, looks the order up, acts, and
reports the outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from agentic_jax.data.chat import Message, ToolCall
from agentic_jax.envs.stateful import (
    Database,
    DatabaseTool,
    GoalState,
    StatefulTask,
    apply_calls,
)
from agentic_jax.envs.text.generators import Generator, task_prompt
from agentic_jax.envs.users import Detail, Instruction, Request, RuleUser

SCHEMA = """
CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT NOT NULL, price INTEGER NOT NULL,
                       stock INTEGER NOT NULL);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL, address TEXT NOT NULL);
CREATE TABLE items (order_id TEXT NOT NULL, sku TEXT NOT NULL, quantity INTEGER NOT NULL,
                    PRIMARY KEY (order_id, sku));
"""
SYSTEM = (
    "You are the support agent of an online shop. Help the customer with their orders using "
    "the tools. Ask the customer for any detail you need, such as the order id, instead of "
    "guessing it. Only pending orders can be cancelled or changed; change only what the "
    "customer asks for. When a request is handled, tell the customer the outcome in one "
    "sentence, without a question."
)
PRODUCTS = (
    "blue mug",
    "desk lamp",
    "notebook",
    "water bottle",
    "headphones",
    "backpack",
    "phone case",
    "tea kettle",
    "yoga mat",
    "wall clock",
)
STREETS = ("Elm Street", "Harbour Road", "Mill Lane", "Oak Avenue", "Station Road")
CITIES = ("Springfield", "Riverton", "Lakeside", "Fairview")
KINDS = ("cancel", "quantity", "address", "total")
PENDING = "pending"


def money(cents: int) -> str:
    return f"${cents / 100:.2f}"


def _refusal(db: Database, order_id: str) -> str | None:
    """Why ``order_id`` cannot change, or None when it can."""
    rows = db.query("SELECT status FROM orders WHERE order_id = ?", order_id)
    if not rows:
        return f"error: no order {order_id}"
    if rows[0]["status"] != PENDING:
        return f"error: order {order_id} is {rows[0]['status']}; only pending orders can change"
    return None


def _order_id_schema(**properties) -> dict:
    return {
        "additionalProperties": False,
        "properties": {"order_id": {"type": "string"}, **properties},
        "required": ["order_id", *properties],
        "type": "object",
    }


class GetOrder(DatabaseTool):
    name = "get_order"
    description = "An order's status, shipping address, items (sku, name, quantity, price), total."
    parameters = _order_id_schema()

    def apply(self, db, order_id):
        rows = db.query("SELECT status, address FROM orders WHERE order_id = ?", order_id)
        if not rows:
            return f"error: no order {order_id}"
        items = db.query(
            "SELECT sku, name, quantity, price FROM items JOIN products USING (sku) "
            "WHERE order_id = ? ORDER BY sku",
            order_id,
        )
        return json.dumps(
            {
                "order_id": order_id,
                "status": rows[0]["status"],
                "address": rows[0]["address"],
                "items": [{**dict(i), "price": money(i["price"])} for i in items],
                "total": money(sum(i["quantity"] * i["price"] for i in items)),
            }
        )


class CancelOrder(DatabaseTool):
    name = "cancel_order"
    description = "Cancel a pending order; its items go back to stock."
    parameters = _order_id_schema()

    def apply(self, db, order_id):
        refusal = _refusal(db, order_id)
        if refusal:
            return refusal
        db.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", order_id)
        db.execute(
            "UPDATE products SET stock = stock + (SELECT quantity FROM items "
            "WHERE items.sku = products.sku AND order_id = ?) "
            "WHERE sku IN (SELECT sku FROM items WHERE order_id = ?)",
            order_id,
            order_id,
        )
        return f"order {order_id} cancelled"


class ChangeQuantity(DatabaseTool):
    name = "change_quantity"
    description = "Set how many of one item (by sku) a pending order has; more needs stock."
    parameters = _order_id_schema(
        sku={"type": "string"}, quantity={"minimum": 1, "type": "integer"}
    )

    def apply(self, db, order_id, sku, quantity):
        refusal = _refusal(db, order_id)
        if refusal:
            return refusal
        rows = db.query(
            "SELECT quantity, stock FROM items JOIN products USING (sku) "
            "WHERE order_id = ? AND sku = ?",
            order_id,
            sku,
        )
        if not rows:
            return f"error: order {order_id} has no item {sku}"
        more = quantity - rows[0]["quantity"]
        if more > rows[0]["stock"]:
            return f"error: only {rows[0]['stock']} more {sku} in stock"
        db.execute("UPDATE products SET stock = stock - ? WHERE sku = ?", more, sku)
        db.execute(
            "UPDATE items SET quantity = ? WHERE order_id = ? AND sku = ?", quantity, order_id, sku
        )
        return f"order {order_id} now has {quantity} x {sku}"


class ChangeAddress(DatabaseTool):
    name = "change_address"
    description = "Change the shipping address of a pending order."
    parameters = _order_id_schema(address={"minLength": 1, "type": "string"})

    def apply(self, db, order_id, address):
        refusal = _refusal(db, order_id)
        if refusal:
            return refusal
        db.execute("UPDATE orders SET address = ? WHERE order_id = ?", address, order_id)
        return f"order {order_id} will ship to {address}"


class _Plan(NamedTuple):
    """One request: what the user holds, the golden actions, and the golden agent's words."""

    request: Request
    calls: tuple[ToolCall, ...]
    ask: str
    report: str
    outputs: tuple[str, ...] = ()


def _address(rng: np.random.Generator) -> str:
    return f"{int(rng.integers(1, 200))} {rng.choice(STREETS)}, {rng.choice(CITIES)}"


def _plan(kind: str, db: Database, order_id: str, rng: np.random.Generator) -> _Plan:
    """The request of ``kind`` on ``order_id``, drawn against the database as it is now."""
    order = Detail("order id", order_id, ("order id", "order number", "which order"))
    look = ToolCall("get_order", {"order_id": order_id})
    if kind == "cancel":
        return _Plan(
            Request("cancel an order", (order,)),
            (look, ToolCall("cancel_order", {"order_id": order_id})),
            "Which order would you like to cancel? Please give me its order id.",
            f"Order {order_id} is cancelled.",
        )
    if kind == "quantity":
        items = db.query(
            "SELECT sku, name, quantity, stock FROM items JOIN products USING (sku) "
            "WHERE order_id = ? ORDER BY sku",
            order_id,
        )
        item = items[int(rng.integers(len(items)))]
        old = item["quantity"]  # at least 2 (see `Orders.sample`), so 1 is always a change
        new = int(rng.choice([q for q in range(1, old + item["stock"] + 1) if q != old]))
        change = {"order_id": order_id, "sku": item["sku"], "quantity": new}
        return _Plan(
            Request(
                "change how many of an item in an order I get",
                (
                    order,
                    Detail("item", item["name"], ("item", "product")),
                    Detail("new quantity", str(new), ("quantity", "how many")),
                ),
            ),
            (look, ToolCall("change_quantity", change)),
            "What is the order id, which item is it, and what quantity would you like?",
            f"Order {order_id} now has {new} x {item['name']}.",
        )
    if kind == "address":
        current = db.query("SELECT address FROM orders WHERE order_id = ?", order_id)[0][0]
        new = _address(rng)
        while new == current:
            new = _address(rng)
        return _Plan(
            Request(
                "change the shipping address of an order",
                (order, Detail("new address", new, ("address",))),
            ),
            (look, ToolCall("change_address", {"order_id": order_id, "address": new})),
            "What is the order id, and what is the new address?",
            f"Order {order_id} will now ship to {new}.",
        )
    total = json.loads(GetOrder().apply(db, order_id))["total"]
    return _Plan(
        Request("know the total price of an order", (order,)),
        (look,),
        "What is the order id?",
        f"The total of order {order_id} is {total}.",
        outputs=(total.lstrip("$"),),
    )


class Orders(Generator):
    """``difficulty`` requests, each on its own order, of kinds drawn from ``requests`` (see
    the module docstring); ``extra_orders`` more orders that no request names."""

    def __init__(self, difficulty: int = 1, requests: Sequence[str] = KINDS, extra_orders: int = 2):
        super().__init__(difficulty)
        unknown = sorted(set(requests) - set(KINDS))
        if unknown or not requests:
            raise ValueError(f"Orders.requests must be some of {KINDS}, got {tuple(requests)}")
        if extra_orders < 0:
            raise ValueError(f"Orders.extra_orders must be >= 0, got {extra_orders}")
        self.requests, self.extra_orders = tuple(requests), extra_orders
        self.tools = (GetOrder(), CancelOrder(), ChangeQuantity(), ChangeAddress())
        self.reward = GoalState()

    @property
    def max_turns(self) -> int:
        return 4 * self.difficulty  # ask, look up, act, report

    def sample(self, seed: int) -> StatefulTask:
        rng = np.random.default_rng(seed)
        products = tuple(
            (
                name.replace(" ", "-"),
                name,
                int(rng.integers(5, 80)) * 100 + 99 * int(rng.integers(2)),
                int(rng.integers(0, 6)),
            )
            for name in map(str, rng.choice(PRODUCTS, 6, replace=False))
        )
        kinds = [str(k) for k in rng.choice(self.requests, self.difficulty)]
        numbers = rng.choice(9000, self.difficulty + self.extra_orders, replace=False) + 1000
        orders, items = [], []
        for i, number in enumerate(numbers):
            kind = kinds[i] if i < self.difficulty else None
            changes = kind not in (None, "total")
            status = PENDING if changes else str(rng.choice(["pending", "shipped", "delivered"]))
            order_id = f"W{number}"
            orders.append((order_id, status, _address(rng)))
            least = 2 if kind == "quantity" else 1  # so that a smaller quantity exists
            for p in rng.choice(len(products), int(rng.integers(1, 4)), replace=False):
                items.append((order_id, products[p][0], int(rng.integers(least, 4))))
        rows = (("products", products), ("orders", tuple(orders)), ("items", tuple(items)))
        db = Database(SCHEMA, rows)
        initial_hash, plans, results = db.state_hash(), [], []
        for kind, (order_id, _, _) in zip(kinds, orders):
            plans.append(_plan(kind, db, order_id, rng))
            results.append(apply_calls(db, self.tools, plans[-1].calls))
        instruction = Instruction(tuple(p.request for p in plans))
        user = RuleUser(instruction, seed)
        opening, demonstration = user.opening(), []
        for i, (plan, outcome) in enumerate(zip(plans, results)):
            demonstration += [Message("assistant", plan.ask), Message("user", user.reply(plan.ask))]
            for call, result in zip(plan.calls, outcome):
                demonstration += [Message("assistant", "", (call,)), Message("tool", result)]
            demonstration.append(Message("assistant", plan.report))
            if i + 1 < len(plans):  # the user's last reply says it is done: no turn to learn
                demonstration.append(Message("user", user.reply(plan.report)))
        outputs = tuple(o for p in plans for o in p.outputs)
        return StatefulTask(
            task_prompt(SYSTEM, opening, self.tools),
            " ".join(outputs),
            demonstration=tuple(demonstration),
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
            schema=SCHEMA,
            rows=rows,
            golden=tuple(c for p in plans for c in p.calls),
            outputs=outputs,
            instruction=instruction,
            initial_hash=initial_hash,
            goal_hash=db.state_hash(),
        )
