"""`ragkit serve`: an OpenAI-compatible HTTP server over ragkit (FastAPI + uvicorn).

    from ragkit.serve import create_app
    app = create_app(settings, token="secret")   # app.state.ragkit is the ServeState
"""

from ragkit.serve.app import create_app
from ragkit.serve.server_state import ServeState

__all__ = ["create_app", "ServeState"]
