"""The package version, in one place: setuptools reads it (``pyproject.toml``), and so do
``fsm_agent.__version__`` and ``fsm-agent --version``. Each release adds a CHANGELOG entry."""

__version__ = "0.1.0"
