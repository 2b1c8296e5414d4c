"""The OpenAI-compatible chat-completions protocol: ``openai_request`` validates requests (its errors,
in OpenAI's words: ``openai_errors``), ``openai_api`` speaks HTTP (response and error shapes). It
imports nothing of agentrl's runners: the backend behind it
(``agentrl.rollout.agent_endpoint.AgentEndpoint``) keeps one token ledger per episode and
generates the turns; ``agentrl serve`` (``agentrl.cli.serve``) puts a config's policy behind it.
"""
