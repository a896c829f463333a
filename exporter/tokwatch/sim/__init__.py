"""Simulated inference servers (vLLM, llama.cpp, Ollama, OpenAI, SGLang) with ground truth."""

from tokwatch.sim.config import SimConfig, load_sim_config, load_sim_config_text
from tokwatch.sim.server import build_app, serve_sim

__all__ = ["SimConfig", "build_app", "load_sim_config", "load_sim_config_text", "serve_sim"]
