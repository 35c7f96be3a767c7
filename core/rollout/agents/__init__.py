"""Agent rollouts: the OpenAI-compatible endpoint agent code talks to, and its episodes.

An agent (plugins/agents/) is ordinary ``openai`` (or ``anthropic``) client
code. The endpoint (``endpoint``: requests checked in ``requests`` and
``fields``, refusals in ``errors``, answers shaped in ``responses``; the
Responses and Messages APIs read in ``formats`` and answered in
``format_replies``; stop strings and logprob tokens in ``reply_text``; agents in this process reach
it without a socket through ``in_process``) samples each request's reply as one turn (``turns``), the
turns of concurrent episodes in one batch (``batch``), and records every
episode token exact (``transcript``, the conversation as ids in ``chat_ids``,
rendered with ``chat_tokenizer``'s template where the model has none);
``episodes`` runs many agents at once, each under a deadline. The endpoint
and the agents' clients need the ``agents`` extra (fastapi, uvicorn, openai, anthropic, jsonschema).
"""
