"""A tiny OpenEnv environment for rft's ``openenv_env`` workflow: guess a hidden word one letter
at a time (hangman), written only against openenv-core (it does not import rft).

Each step the action names a letter (the first letter of ``LetterGuess.letter`` counts); the
observation shows the word with the found letters filled in. Reward: each new letter found earns
its share of the word's letters, so an episode's rewards sum to the share of the word revealed
(1.0 when solved). The episode ends when the word is solved or after ``lives`` wrong guesses.
``reset(seed=...)`` picks the word from WORDS (or ``word=`` names it).

In-process: ``workflow_args.env: word_guess:WordGuessEnvironment`` with this folder as a plugin
directory. As a server (from this folder): ``uvicorn word_guess:app --host 127.0.0.1 --port 8011``
and ``workflow_args.base_url: http://127.0.0.1:8011``, ``action: word_guess:LetterGuess``.
"""

from __future__ import annotations

import random
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ("cat", "sun", "tree", "rain", "moon", "bird", "star", "fish", "lamp", "rose")


class LetterGuess(Action):
    letter: str = Field(..., min_length=1, description="a letter; only its first one counts")


class WordObservation(Observation):
    text: str = Field(default="", description="the word so far and what happened")
    lives_left: int = Field(default=0, description="wrong guesses left")


class WordGuessEnvironment(Environment[LetterGuess, WordObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own instance and word

    def __init__(self, lives: int = 4):
        super().__init__()
        self.lives = lives
        self._state = State(episode_id=str(uuid4()))
        self._word, self._found, self._left = "", set(), lives

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        word: Optional[str] = None,
        **kwargs: Any,
    ) -> WordObservation:
        self._word = (word or random.Random(seed).choice(WORDS)).lower()
        self._found, self._left = set(), self.lives
        self._state = State(episode_id=episode_id or str(uuid4()))
        return self._observe(f"Guess my {len(self._word)}-letter word. Reply with one letter.")

    def step(self, action: LetterGuess, timeout_s: Optional[float] = None, **kwargs: Any):
        self._state.step_count += 1
        letter = next((c for c in action.letter.lower() if c.isalpha()), "")
        reward = 0.0
        if not letter:
            note = "That was no letter."
        elif letter in self._found:
            note = f"You already found {letter}."
        elif letter in self._word:
            self._found.add(letter)
            reward = self._word.count(letter) / len(self._word)
            note = f"Yes, {letter} is in the word."
        else:
            self._left -= 1
            note = f"No {letter}."
        solved = set(self._word) <= self._found
        obs = self._observe(f"{note} Reply with one letter.", reward)
        obs.done = solved or self._left <= 0
        return obs

    @property
    def state(self) -> State:
        return self._state

    def _observe(self, note: str, reward: float = 0.0) -> WordObservation:
        shown = " ".join(c if c in self._found else "_" for c in self._word)
        return WordObservation(
            text=f"{shown}\n{note} Wrong guesses left: {self._left}.",
            lives_left=self._left,
            reward=reward,
        )


# the HTTP/WebSocket server (uvicorn word_guess:app): one WordGuessEnvironment per session
app = create_app(WordGuessEnvironment, LetterGuess, WordObservation, max_concurrent_envs=64)
