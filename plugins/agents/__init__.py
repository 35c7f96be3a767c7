"""Agents: code that talks to the policy through an OpenAI-compatible endpoint (docs/plugin_hooks.md).

An agent (``rlax_register_agents``) is a function or a callable object given an
``openai`` client and the task's prompt; :mod:`.runner` (``samplers.agents``)
runs its episodes behind the ordinary Sampler contract, token exact.
"""
