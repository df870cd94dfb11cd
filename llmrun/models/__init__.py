"""Models by name: references, the registry (models.toml), resolution, the store, the Hub, packaged
models and other tools' stores."""
