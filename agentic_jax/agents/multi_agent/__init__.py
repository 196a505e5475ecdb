"""Multi-agent patterns over agentic-jax agents (see the "Multi-agent" section of docs/agents.md
and docs/agent_protocols.md).

``team`` (members, messages, budgets, accounting, termination, :class:`TeamResult`);
``orchestration`` (orchestrator-workers and hierarchical teams, optionally following a
``task_dag`` plan), ``peer`` (peer-to-peer message passing), ``blackboard`` (and the
confidence-gated :class:`ConfidenceBoard`), ``voting`` (majority and confidence-weighted
consensus, Delphi rounds), ``debate``, ``contract_net``; the coordination structures
``task_dag`` (dependencies, waves, failure propagation), ``bus`` (topic pub/sub of FIPA-ACL
messages with acknowledgements and retries) and ``router`` (a contextual-bandit router over
models, agents or tool chains); ``research`` (a planner / researcher / writer / critic workflow
over local retrieval) and ``session`` (what ``agentic-jax team`` runs).
"""

from agentic_jax.agents.multi_agent.blackboard import (
    Blackboard,
    ConfidenceBoard,
    Entry,
    Posting,
    parse_choice,
)
from agentic_jax.agents.multi_agent.bus import (
    ACLMessage,
    DeadLetter,
    Delivery,
    MessageBus,
    Performative,
)
from agentic_jax.agents.multi_agent.contract_net import Bid, ContractNet, parse_bid, rank_bids
from agentic_jax.agents.multi_agent.debate import Debate
from agentic_jax.agents.multi_agent.orchestration import OrchestratorWorkers
from agentic_jax.agents.multi_agent.peer import PeerNetwork
from agentic_jax.agents.multi_agent.research import RESEARCH_CORPUS, ResearchWorkflow
from agentic_jax.agents.multi_agent.router import Routed, Router, RouterState, cumulative_regret
from agentic_jax.agents.multi_agent.task_dag import DagRun, Task, TaskDAG, run_dag
from agentic_jax.agents.multi_agent.team import (
    AgentMessage,
    AgentStats,
    Failure,
    Pattern,
    Team,
    TeamLimits,
    TeamMember,
    TeamResult,
)
from agentic_jax.agents.multi_agent.voting import (
    Delphi,
    Tally,
    Vote,
    normalize,
    panel_summary,
    parse_vote,
    tally,
)

__all__ = [
    "RESEARCH_CORPUS",
    "ACLMessage",
    "AgentMessage",
    "AgentStats",
    "Bid",
    "Blackboard",
    "ConfidenceBoard",
    "ContractNet",
    "DagRun",
    "DeadLetter",
    "Debate",
    "Delivery",
    "Delphi",
    "Entry",
    "Failure",
    "MessageBus",
    "OrchestratorWorkers",
    "Pattern",
    "PeerNetwork",
    "Performative",
    "Posting",
    "ResearchWorkflow",
    "Routed",
    "Router",
    "RouterState",
    "Tally",
    "Task",
    "TaskDAG",
    "Team",
    "TeamLimits",
    "TeamMember",
    "TeamResult",
    "Vote",
    "cumulative_regret",
    "normalize",
    "panel_summary",
    "parse_bid",
    "parse_choice",
    "parse_vote",
    "rank_bids",
    "run_dag",
    "tally",
]
