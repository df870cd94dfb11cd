"""Where llmrun keeps things: its home (the store, caches) and its configuration directory."""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "llmrun"


def home_dir() -> Path:
    """Data directory: the model store lives here."""
    env = os.environ.get("LLMRUN_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    env = os.environ.get("LLMRUN_CONFIG_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME, appauthor=False))


def store_dir() -> Path:
    return home_dir() / "models"


def user_registry_path() -> Path:
    return config_dir() / "models.toml"
