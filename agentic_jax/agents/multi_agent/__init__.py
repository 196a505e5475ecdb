"""Multi-agent patterns over agentic-jax agents (see the "Multi-agent" section of docs/agents.md).

``team`` (members, messages, budgets, accounting, termination, :class:`TeamResult`);
``orchestration`` (orchestrator-workers and hierarchical teams), ``peer`` (peer-to-peer message
passing), ``blackboard``, ``voting`` (majority and confidence-weighted consensus), ``debate``,
``contract_net``; ``research`` (a planner / researcher / writer / critic workflow over local
retrieval) and ``session`` (what ``agentic-jax team`` runs).
"""

from agentic_jax.agents.multi_agent.blackboard import Blackboard, Entry, parse_choice
from agentic_jax.agents.multi_agent.contract_net import Bid, ContractNet, parse_bid, rank_bids
from agentic_jax.agents.multi_agent.debate import Debate
from agentic_jax.agents.multi_agent.orchestration import OrchestratorWorkers
from agentic_jax.agents.multi_agent.peer import PeerNetwork
from agentic_jax.agents.multi_agent.research import RESEARCH_CORPUS, ResearchWorkflow
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
from agentic_jax.agents.multi_agent.voting import Tally, Vote, normalize, parse_vote, tally

__all__ = [
    "RESEARCH_CORPUS",
    "AgentMessage",
    "AgentStats",
    "Bid",
    "Blackboard",
    "ContractNet",
    "Debate",
    "Entry",
    "Failure",
    "OrchestratorWorkers",
    "Pattern",
    "PeerNetwork",
    "ResearchWorkflow",
    "Tally",
    "Team",
    "TeamLimits",
    "TeamMember",
    "TeamResult",
    "Vote",
    "normalize",
    "parse_bid",
    "parse_choice",
    "parse_vote",
    "rank_bids",
    "tally",
]
