"""A multi-agent resource scenario: several agents buy from one shared, budgeted market.

Single-agent benchmarks cannot show what happens when agents compete for a scarce tool (the
question CoffeeBench-style economies ask).  Here each agent must acquire ``need`` units of one
good within a money ``budget``; the market restocks ``stock_per_round`` units each round at a
price that rises with the round's demand.  Agents act in rounds, in an order shuffled by the
seed, each taking one turn (one policy call, its tool calls run in order) per round, until every
agent has answered or ``max_rounds`` pass.  A purchase that gets fewer units than asked because
others bought first is a *contention failure*.

Per agent the report gives success (``need`` units bought within budget), units, money spent,
contention failures, tool calls and tokens; the scenario is deterministic given the policies
and the seed.  `MarketSuite` is the scenario as an ``agentic-jax eval`` suite
(``configs/eval_market.gin``) whose every agent is the evaluated policy.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import gin
import numpy as np
from tqdm import tqdm

from agentic_jax.agents.policies.base import Policy, Usage
from agentic_jax.data.chat import Message, ToolSpec
from agentic_jax.eval.suites.report import write_files

SYSTEM = (
    "You are a purchasing agent in a shared market with other agents. Buy {need} units of "
    "coffee without spending more than {budget} credits. Tools: `stock` shows the units left "
    "this round and the price; `buy` buys units at the current price. Stock refills every "
    "round. When you have what you need, or can buy no more, reply with a short summary."
)
STOCK = ToolSpec("stock", "Units left this round and the price per unit.", {"type": "object"})
BUY = ToolSpec(
    "buy",
    "Buy units at the current price; returns how many you got.",
    {
        "additionalProperties": False,
        "properties": {"quantity": {"minimum": 1, "type": "integer"}},
        "required": ["quantity"],
        "type": "object",
    },
)


@dataclasses.dataclass(frozen=True)
class MarketConfig:
    agents: int = 3
    need: int = 4
    budget: float = 40.0
    stock_per_round: int = 4
    base_price: float = 2.0
    surge: float = 0.5  # price rise per unit asked for beyond the stock in the last round
    max_rounds: int = 8
    seed: int = 0

    def __post_init__(self):
        rules = {
            "agents": (self.agents >= 1, ">= 1"),
            "need": (self.need >= 1, ">= 1"),
            "budget": (self.budget > 0, "> 0"),
            "stock_per_round": (self.stock_per_round >= 0, ">= 0"),
            "base_price": (self.base_price > 0, "> 0"),
            "surge": (self.surge >= 0, ">= 0"),
            "max_rounds": (self.max_rounds >= 1, ">= 1"),
        }
        bad = [
            f"{name} must be {rule}, got {getattr(self, name)!r}"
            for name, (ok, rule) in rules.items()
            if not ok
        ]
        if bad:
            raise ValueError("invalid market settings: " + "; ".join(bad))


@dataclasses.dataclass
class AgentLedger:
    units: int = 0
    spent: float = 0.0
    contention_failures: int = 0
    tool_calls: int = 0
    invalid_calls: int = 0
    usage: Usage = Usage()
    answered: bool = False


class Market:
    """The shared state: stock this round, the price, and every agent's ledger."""

    def __init__(self, config: MarketConfig):
        self.config = config
        self.stock, self.price, self.demand = config.stock_per_round, config.base_price, 0
        self.ledgers = [AgentLedger() for _ in range(config.agents)]

    def new_round(self) -> None:
        c = self.config
        excess = max(0, self.demand - c.stock_per_round)
        self.price = c.base_price + c.surge * excess
        self.stock, self.demand = c.stock_per_round, 0

    def call(self, agent: int, name: str, arguments) -> str:
        ledger = self.ledgers[agent]
        ledger.tool_calls += 1
        if name == "stock":
            return json.dumps({"units": self.stock, "price": self.price})
        quantity = arguments.get("quantity") if isinstance(arguments, dict) else None
        if name != "buy" or not isinstance(quantity, int) or quantity < 1:
            ledger.invalid_calls += 1
            return 'error: call stock {} or buy {"quantity": N} with N >= 1'
        self.demand += quantity
        affordable = int((self.config.budget - ledger.spent) // self.price)
        got = min(quantity, self.stock, affordable)
        if got < quantity and self.stock < min(quantity, affordable):
            ledger.contention_failures += 1  # short because others took the stock first
        self.stock -= got
        ledger.units += got
        ledger.spent += got * self.price
        return json.dumps({"bought": got, "price": self.price, "units_owned": ledger.units})


def run_market(
    policies: Sequence[Policy],
    config: MarketConfig,
    sampling: dict | None = None,
    *,
    progress: bool = False,
):
    """Plays the scenario (a progress bar over rounds if ``progress``); returns ``(per-agent
    rows, totals)``."""
    if len(policies) != config.agents:
        raise ValueError(
            f"{config.agents} agents need {config.agents} policies, got {len(policies)}"
        )
    market = Market(config)
    system = SYSTEM.format(need=config.need, budget=config.budget)
    histories = [
        [Message("system", system), Message("user", "The market is open.")] for _ in policies
    ]
    rng = np.random.default_rng(config.seed)
    for round_ in tqdm(range(config.max_rounds), "market", unit="round", disable=not progress):
        if round_:
            market.new_round()
        for agent in rng.permutation(config.agents):
            ledger = market.ledgers[agent]
            if ledger.answered:
                continue
            reply = policies[agent].respond(histories[agent], [STOCK, BUY], **(sampling or {}))
            ledger.usage = ledger.usage + reply.usage
            histories[agent].append(reply.to_message())
            if not reply.tool_calls:
                ledger.answered = True
                continue
            for call in reply.tool_calls:
                histories[agent].append(
                    Message("tool", market.call(agent, call.name, call.arguments))
                )
        if all(ledger.answered for ledger in market.ledgers):
            break
    rows = [
        {
            "agent": i,
            "success": ledger.units >= config.need and ledger.spent <= config.budget,
            "units": ledger.units,
            "spent": ledger.spent,
            "contention_failures": ledger.contention_failures,
            "tool_calls": ledger.tool_calls,
            "invalid_calls": ledger.invalid_calls,
            "tokens": ledger.usage.total_tokens,
        }
        for i, ledger in enumerate(market.ledgers)
    ]
    totals = {
        "success": float(np.mean([r["success"] for r in rows])),
        "contention_failures": sum(r["contention_failures"] for r in rows),
        "spent_per_agent": float(np.mean([r["spent"] for r in rows])),
        "units_per_agent": float(np.mean([r["units"] for r in rows])),
        **{key: sum(r[key] for r in rows) for key in ("tool_calls", "invalid_calls", "tokens")},
    }
    return rows, totals


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class MarketSuite(MarketConfig):
    """The scenario as an ``agentic-jax eval`` suite: every agent is the evaluated policy (one
    policy answering each agent's own conversation), so the report shows a model competing with
    copies of itself for a scarce good.  ``temperature`` and ``max_tokens`` go into every call."""

    name: str = "market"
    temperature: float = 0.0
    max_tokens: int = 128

    def __post_init__(self):
        super().__post_init__()
        if self.temperature < 0 or self.max_tokens < 1:
            raise ValueError(
                f"MarketSuite needs temperature >= 0 and max_tokens >= 1, got "
                f"{self.temperature} and {self.max_tokens}"
            )

    def evaluate(self, policy: Policy, out_dir, *, evaluated: str, progress: bool = True) -> dict:
        """Plays the market and writes ``results.json`` and ``report.md`` into ``out_dir``."""
        sampling = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        rows, totals = run_market([policy] * self.agents, self, sampling, progress=progress)
        result = {
            "suite": self.name,
            "settings": dataclasses.asdict(self),
            "evaluated": evaluated,
            "agents": rows,
            "totals": totals,
        }
        write_files(out_dir, result, market_markdown(result), {})
        return result


def market_markdown(result: dict) -> str:
    """The market's report: the settings, then one row per agent and one for all of them."""
    s, t = result["settings"], result["totals"]
    lines = [
        f"# Evaluation: suite `{result['suite']}`",
        "",
        f"Evaluated: `{result['evaluated']}`, playing each of {s['agents']} agents in one market. "
        f"Each must buy {s['need']} units within {s['budget']} credits; {s['stock_per_round']} "
        f"units are restocked every round at {s['base_price']} credits plus {s['surge']} per "
        f"unit of the last round's excess demand; at most {s['max_rounds']} rounds, order of "
        f"play shuffled by seed {s['seed']}; temperature {s['temperature']}.",
        "",
        "| agent | success | units | spent | contention failures | tool calls | invalid calls "
        "| tokens |",
        "|" + " --- |" * 8,
    ]
    for r in result["agents"]:
        lines.append(
            f"| {r['agent']} | {'yes' if r['success'] else 'no'} | {r['units']} | "
            f"{r['spent']:g} | {r['contention_failures']} | {r['tool_calls']} | "
            f"{r['invalid_calls']} | {r['tokens']} |"
        )
    lines += [
        f"| all | {t['success']:.3f} | {t['units_per_agent']:.3g} | {t['spent_per_agent']:.3g} | "
        f"{t['contention_failures']} | {t['tool_calls']} | {t['invalid_calls']} | {t['tokens']} |",
        "",
        "All: the success rate and the mean units and spending per agent; the other columns are "
        "totals. A contention failure is a purchase cut short because others bought first.",
    ]
    return "\n".join(lines) + "\n"
