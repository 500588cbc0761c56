"""STAND-IN for ``habitat_sim.agent``: agent configuration, state and the agent body."""

from .agent import ActionSpec, ActuationSpec, Agent, AgentConfiguration, AgentState, SixDOFPose

__all__ = ["ActionSpec", "ActuationSpec", "Agent", "AgentConfiguration", "AgentState",
           "SixDOFPose"]
