"""textarena: TextArena's single-player games as multi-turn episodes, unchanged: the game writes the
observations, the model's turns are its moves, the game's own outcome is the reward.

    pip install 'agentrl[textarena]'

    env:
      name: textarena
      options:
        game: Mastermind-v0          # any single-player game TextArena registers
        game_options: {}             # keyword arguments of that game's constructor
        max_turns: 30                # agentrl's turn budget, beside the game's own limit

- ``game``: an id in TextArena's registry (``textarena.envs.registration.ENV_REGISTRY``, e.g.
  ``Mastermind-v0``, ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``Wordle-v0``); an unknown one fails
  before the run, with a did-you-mean, and so does a game that cannot be made with ``game_options``. Games are made with ``textarena.make``, so its default
  wrappers apply (the action formatting that puts a bare move in brackets).
- **Tasks** are games: a task is a game id and a seed for its ``reset``. Seeds go to ``train`` or
  ``test`` by a hash (``environments.generators.split_of``), so a held-out seed is never trained on;
  ``run.seed`` picks which seeds a split draws. Games with little randomness (TowerOfHanoi's start is
  always the same; GuessTheNumber has 20 secrets) repeat across seeds whatever the split says. The
  task's prompt is a label (``TextArena Mastermind-v0, seed 123``); the model sees the game's text.
- **Turns.** ``reset`` returns the game's opening messages as the user message; each model turn goes
  to the game's ``step``, and what the game says back (its feedback, the board, an invalid-move
  notice) is the next user message. The model's own move, which TextArena echoes, is left out.
- **Invalid moves** are the game's business: TextArena tells the model and, after its allowance,
  ends the game with its own outcome.
- **Reward.** ``outcome``: the game's reward for the player when the game ends (``env.close()``:
  1 for a win, partial credit or 0 / -1 as the game defines it). ``finished`` (weight 0): 1 when the
  game ended, 0 when agentrl's turn budget (``max_turns``) stopped it first, whose outcome is 0.
  The game's closing information (``invalid_move``, ``reason``, ``turn_count``) is in the episode's info.
- A game that raises fails that episode at the ``env`` boundary; the run goes on.
- No demonstrations: TextArena has no solvers.

Wordle, Hangman and a few word games load NLTK's ``words`` corpus and POS tagger, which NLTK
downloads on first use: on a machine without network the game cannot be made (NLTK's
``LookupError: Resource 'words' not found``), and the run is refused before it starts, unless
``NLTK_DATA`` points at a copy.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.env import Environment, EpisodeState, Message, Reward, StepResult, Task, register
from environments.adapters.packages import require
from environments.generators import sample_tasks

GAME_MESSAGE = -1  # TextArena's sender id for the game itself


def is_move_echo(kind: list[Any]) -> bool:
    """An observation of type ``PLAYER_ACTION``: the player's own move, which some games (Wordle)
    record with the game as the sender."""
    return bool(kind) and getattr(kind[0], "name", None) == "PLAYER_ACTION"


def _ta() -> Any:
    return require("textarena", "textarena", "textarena")


@functools.lru_cache(maxsize=1)
def game_ids() -> tuple[str, ...]:
    _ta()
    from textarena.envs.registration import ENV_REGISTRY

    return tuple(sorted(ENV_REGISTRY))


def check_game(game: str) -> None:
    ids = game_ids()
    if game not in ids:
        guess = difflib.get_close_matches(game, ids, n=1)
        did = f" Did you mean {guess[0]!r}?" if guess else ""
        raise ValueError(f"TextArena has no game {game!r}.{did} ({len(ids)} games are registered)")


def make_game(game: str, game_options: dict | None = None) -> Any:
    """``textarena.make(game, **game_options)``, with its default wrappers."""
    check_game(game)
    return _ta().make(env_id=game, **dict(game_options or {}))


@functools.lru_cache(maxsize=32)
def check_startable(game: str, options_json: str = "{}") -> None:
    """Make ``game`` once per process: a wrong ``game_options`` key, or data the game cannot load
    (Wordle without NLTK's word list), fails before the run instead of in every episode."""
    try:
        make_game(game, json.loads(options_json))
    except ImportError:
        raise
    except Exception as e:
        raise ValueError(
            f"TextArena game {game!r} with game_options {options_json} cannot be made: {type(e).__name__}: "
            + " ".join(str(e).replace("*" * 10, "").split())  # NLTK's banner, on one line
        ) from e


def innermost(env: Any) -> Any:
    """The game under TextArena's wrappers: it hands out each player's new messages, one by one."""
    while hasattr(env, "env"):
        env = env.env
    return env


def textarena_tasks(
    split: str,
    n: int | None = None,
    seed: int = 0,
    game: str = "Mastermind-v0",
    game_options: dict | None = None,
) -> list[Task]:
    """Seeded games of ``game`` for ``split`` (see the module docstring)."""
    check_game(game)
    family = f"textarena:{game}"

    def make(rng: Any) -> tuple[str, str, Any, dict[str, Any]]:
        game_seed = rng.randrange(2**31)
        meta = {"game": game, "game_options": dict(game_options or {}), "game_seed": game_seed}
        return f"{family}|{game_seed}", f"TextArena {game}, seed {game_seed}", None, meta

    return sample_tasks(family, make, split, n, seed)


def _outcome(task: Task, state: EpisodeState) -> float:
    return float(state.info.get("outcome", 0.0))


def _finished(task: Task, state: EpisodeState) -> float:
    return float("outcome" in state.info)


@register
class TextArena(Environment):
    """A single-player TextArena game, one model turn per move."""

    name = "textarena"
    max_turns = 30
    system_prompt: ClassVar[str | None] = None
    """None: TextArena's own prompt for game-playing agents (``STANDARD_GAME_PROMPT``)."""
    game: str = "Mastermind-v0"
    """A TextArena game id (single-player)."""
    game_options: dict = {}  # noqa: RUF012 (an option's default; never mutated)
    """Keyword arguments of the game's constructor (``textarena.make``)."""
    task_options: ClassVar[tuple[str, ...]] = ("game", "game_options")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        check_game(self.game)  # a wrong id, options or missing game data fail here, before the run
        check_startable(self.game, json.dumps(dict(self.game_options), sort_keys=True))
        self._game: Any = None
        self._player = 0

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """Seeded games; options ``game`` and ``game_options`` (from ``env.options``)."""
        return textarena_tasks(split, n, seed, **options)

    def reset(self, task: Task, seed: int) -> list[Message]:
        self.close()
        self.task, self.seed = task, seed
        meta = task.metadata
        self._game = make_game(meta.get("game", self.game), meta.get("game_options", self.game_options))
        self._game.reset(num_players=1, seed=int(meta.get("game_seed", seed)))
        messages: list[Message] = []
        prompt = (
            self.system_prompt
            or require("textarena.agents.basic_agents", "textarena", "textarena").STANDARD_GAME_PROMPT
        )
        if prompt:
            messages.append({"role": "system", "content": prompt})
        return [*messages, {"role": "user", "content": self._new_messages()}]

    def _new_messages(self) -> str:
        """What the game told the player since its last move, without the echo of that move."""
        player, items = innermost(self._game).get_observation()
        self._player = player
        return "\n".join(
            str(text).strip()
            for sender, text, *kind in items
            if sender != player and not is_move_echo(kind) and str(text).strip()
        )

    def step(self, action: str) -> StepResult:
        if self._game is None:
            raise RuntimeError("textarena: no game (reset was not called)")
        done, _ = self._game.step(action=action)
        if not done:
            return StepResult([{"role": "user", "content": self._new_messages()}], 0.0, False, False, {})
        last = self._new_messages()
        rewards, game_info = self._game.close()
        self._game = None
        player_info = dict((game_info or {}).get(self._player, {}))
        info = {
            "outcome": float((rewards or {}).get(self._player, 0.0)),
            "game_info": {k: v for k, v in player_info.items() if isinstance(v, (str, int, float, bool))},
            "final_message": last,
        }
        return StepResult([], 0.0, True, False, info)

    def close(self) -> None:
        game, self._game = self._game, None
        if game is not None:
            game.close()  # an unfinished game closes too (its outcome is then not used)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        raise NotImplementedError("TextArena games have no solver demonstrations")

    def rewards(self) -> list[Reward]:
        return [Reward("outcome", _outcome, 1.0), Reward("finished", _finished, 0.0)]
