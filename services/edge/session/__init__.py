"""The edge's MQTT session as a sans-IO core: services/edge/session/core.py (Session), the
actions it returns (actions.py), its state (state.py) and the packet handlers (handle_*.py)."""

from services.edge.session.actions import Action, Pause
from services.edge.session.core import Session
from services.edge.session.environment import EdgeServices
from services.edge.session.state import State

__all__ = ["Action", "EdgeServices", "Pause", "Session", "State"]
