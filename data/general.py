"""A deterministic "general text" corpus: templated stories, instructions and descriptions.

Its distribution is deliberately far from arith_chain (words, not digit chains), so a drafter
initialised on the target's completions of these prompts is the workbench's "chat init"
(docs/design.md §2) and one initialised on task prompts is "in-domain init".

Each item is {"prompt": ..., "text": ...}: `prompt` is an instruction or a first sentence ending
with "\\n", `text` a continuation of a few sentences.
"""

from __future__ import annotations

import random

VERSION = 1  # bump when the templates change: invalidates the cached tokenizer and models

NAMES = ["Mira", "Tom", "Ada", "Leo", "Nina", "Sam", "Ivy", "Omar", "Lena", "Kai", "Rosa", "Ben"]
ANIMALS = ["fox", "owl", "cat", "dog", "rabbit", "bear", "horse", "crow", "goat", "turtle", "mouse", "deer"]
ADJECTIVES = ["curious", "quiet", "brave", "tired", "clever", "gentle", "proud", "lonely", "happy", "careful"]
PLACES = ["river", "forest", "village", "market", "garden", "harbor", "hill", "library", "bridge", "farm"]
OBJECTS = ["lamp", "map", "basket", "key", "letter", "coat", "drum", "kite", "book", "boat"]
COLORS = ["red", "blue", "green", "yellow", "silver", "brown", "white", "dark"]
WEATHER = ["rain", "snow", "wind", "fog", "sun", "storm"]
TIMES = ["morning", "evening", "night", "afternoon"]
DISHES = ["soup", "bread", "salad", "pie", "tea", "rice"]
INGREDIENTS = ["onions", "carrots", "flour", "apples", "beans", "butter", "honey", "salt", "lemons", "milk"]
TOOLS = ["a pot", "a knife", "a bowl", "a pan", "a spoon", "an oven"]


def _story(r: random.Random) -> dict:
    name, animal, adj, place, obj = (
        r.choice(NAMES),
        r.choice(ANIMALS),
        r.choice(ADJECTIVES),
        r.choice(PLACES),
        r.choice(OBJECTS),
    )
    prompt = f"Write a short story about a {adj} {animal} and a {obj}.\n"
    text = (
        f"Once upon a time, a {adj} {animal} lived near the {place}. "
        f"One {r.choice(TIMES)}, the {animal} found a {r.choice(COLORS)} {obj} under a tree. "
        f"A girl named {name} saw it and asked where the {obj} came from. "
        f"Together they walked to the {r.choice(PLACES)} to find its owner, "
        f"and by the end of the day the {animal} was not {adj} anymore."
    )
    return {"prompt": prompt, "text": text}


def _recipe(r: random.Random) -> dict:
    dish = r.choice(DISHES)
    a, b, c = r.sample(INGREDIENTS, 3)
    prompt = f"Explain how to make a simple {dish}.\n"
    text = (
        f"First, wash the {a} and the {b}. "
        f"Then put them in {r.choice(TOOLS)} with some {c}. "
        f"Cook everything slowly and stir from time to time. "
        f"When it smells good, serve the {dish} warm and share it with a friend."
    )
    return {"prompt": prompt, "text": text}


def _place(r: random.Random) -> dict:
    place, color, weather = r.choice(PLACES), r.choice(COLORS), r.choice(WEATHER)
    prompt = f"Describe a {place} in the {weather}.\n"
    text = (
        f"The {place} looks different in the {weather}. "
        f"The {color} roofs shine and the paths are empty. "
        f"Only a {r.choice(ADJECTIVES)} {r.choice(ANIMALS)} moves between the trees, "
        f"looking for a dry place to rest. "
        f"Later the {weather} stops, and people come back with their {r.choice(OBJECTS)}s."
    )
    return {"prompt": prompt, "text": text}


def _letter(r: random.Random) -> dict:
    a, b = r.sample(NAMES, 2)
    obj, place = r.choice(OBJECTS), r.choice(PLACES)
    prompt = f"Dear {b}, thank you for the {obj}.\n"
    text = (
        f"I use it every {r.choice(TIMES)} when I go to the {place}. "
        f"Yesterday a {r.choice(ANIMALS)} followed me all the way home. "
        f"I hope you can visit soon, because the {r.choice(DISHES)} is better when we eat together. "
        f"With love, {a}."
    )
    return {"prompt": prompt, "text": text}


TEMPLATES = [_story, _recipe, _place, _letter]


def generate(n: int, seed: int) -> list[dict]:
    """n {"prompt", "text"} items, deterministic for seed. Raises ValueError if n < 0."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    r = random.Random(seed)
    return [r.choice(TEMPLATES)(r) for _ in range(n)]
