"""sparkdeploy: one command from bare DGX Spark hosts to a supervised vLLM service."""

__version__ = "0.1.0"
