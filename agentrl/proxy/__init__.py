"""``agentrl serve``: an OpenAI-compatible endpoint in front of the rollout engine.

``openai_api`` speaks the HTTP protocol (validation, response and error shapes); the backend behind it
keeps one token ledger per episode and generates the turns.
"""
