from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The embedded default model, assembled once per machine under INFER_HOME."""
    from infer.models.default import default_model_path

    return default_model_path()
