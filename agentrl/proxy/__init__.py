"""``agentrl serve``: an OpenAI-compatible endpoint in front of the rollout engine.

``openai_request`` validates requests, ``openai_api`` speaks HTTP (response and error shapes); the
backend behind them (``agent``) keeps one token ledger per episode and generates the turns.
"""
