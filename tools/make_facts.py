"""Generate `evaluators/tasks/autoao_facts.jsonl`: four-choice questions from small fact tables
written for autoao.

    python tools/make_facts.py          # rewrites evaluators/tasks/autoao_facts.jsonl

Every question has one right answer and three distractors drawn from the same table (other
capitals for a capital, other element symbols for a symbol), so a model cannot pick the answer by
its form alone. Arithmetic is the exception: its distractors are near misses (off by one, off by
ten, a neighbouring product), because other rows' results would be easy to rule out by size.
Everything is seeded by the category name, so the output is byte-for-byte reproducible; a test
checks that the committed file is what this script writes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "evaluators" / "tasks" / "autoao_facts.jsonl"

##### fact tables ###############################################################################

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "the United Kingdom": "London", "Ireland": "Dublin", "the Netherlands": "Amsterdam",
    "Belgium": "Brussels", "Austria": "Vienna", "Switzerland": "Bern", "Poland": "Warsaw",
    "the Czech Republic": "Prague", "Hungary": "Budapest", "Greece": "Athens", "Sweden": "Stockholm",
    "Norway": "Oslo", "Denmark": "Copenhagen", "Finland": "Helsinki", "Iceland": "Reykjavik",
    "Russia": "Moscow", "Ukraine": "Kyiv", "Romania": "Bucharest", "Bulgaria": "Sofia",
    "Serbia": "Belgrade", "Croatia": "Zagreb", "Turkey": "Ankara", "Egypt": "Cairo", "Kenya": "Nairobi",
    "Nigeria": "Abuja", "Ethiopia": "Addis Ababa", "Morocco": "Rabat", "Ghana": "Accra",
    "Japan": "Tokyo", "China": "Beijing", "South Korea": "Seoul", "India": "New Delhi",
    "Pakistan": "Islamabad", "Bangladesh": "Dhaka", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "the Philippines": "Manila", "Malaysia": "Kuala Lumpur", "Iran": "Tehran", "Iraq": "Baghdad",
    "Saudi Arabia": "Riyadh", "Afghanistan": "Kabul", "Nepal": "Kathmandu", "Mongolia": "Ulaanbaatar",
    "Syria": "Damascus", "Jordan": "Amman", "Qatar": "Doha", "Australia": "Canberra",
    "New Zealand": "Wellington", "Canada": "Ottawa", "Mexico": "Mexico City", "Brazil": "Brasilia",
    "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota",
    "Venezuela": "Caracas", "Cuba": "Havana", "Ecuador": "Quito", "Uruguay": "Montevideo",
}

ELEMENT_SYMBOLS = {
    "hydrogen": "H", "helium": "He", "lithium": "Li", "boron": "B", "carbon": "C", "nitrogen": "N",
    "oxygen": "O", "fluorine": "F", "neon": "Ne", "sodium": "Na", "magnesium": "Mg",
    "aluminium": "Al", "silicon": "Si", "phosphorus": "P", "sulfur": "S", "chlorine": "Cl",
    "argon": "Ar", "potassium": "K", "calcium": "Ca", "titanium": "Ti", "chromium": "Cr",
    "manganese": "Mn", "iron": "Fe", "cobalt": "Co", "nickel": "Ni", "copper": "Cu", "zinc": "Zn",
    "bromine": "Br", "krypton": "Kr", "silver": "Ag", "tin": "Sn", "iodine": "I", "xenon": "Xe",
    "barium": "Ba", "tungsten": "W", "platinum": "Pt", "gold": "Au", "mercury": "Hg", "lead": "Pb",
    "uranium": "U",
}

# "How many X are in a Y?" -> the number, as written
UNITS = {
    "centimetres are in a metre": "100", "millimetres are in a centimetre": "10",
    "metres are in a kilometre": "1000", "grams are in a kilogram": "1000",
    "millilitres are in a litre": "1000", "seconds are in a minute": "60",
    "minutes are in an hour": "60", "hours are in a day": "24", "days are in a week": "7",
    "months are in a year": "12", "weeks are in a year": "52", "days are in a leap year": "366",
    "days are in a common year": "365", "years are in a decade": "10", "years are in a century": "100",
    "years are in a millennium": "1000", "inches are in a foot": "12", "feet are in a yard": "3",
    "ounces are in a pound": "16", "pounds are in a stone": "14", "quarts are in a gallon": "4",
    "cents are in a dollar": "100", "degrees are in a right angle": "90",
    "degrees are in a straight angle": "180", "degrees are in a full circle": "360",
}

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
DAYS_IN_MONTH = {"January": "31", "February": "28", "March": "31", "April": "30", "May": "31",
                 "June": "30", "July": "31", "August": "31", "September": "30", "October": "31",
                 "November": "30", "December": "31"}
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# word -> its opposite; pairs chosen so that no other answer in the table is also an opposite
OPPOSITES = {
    "hot": "cold", "wet": "dry", "heavy": "light", "push": "pull", "win": "lose", "buy": "sell",
    "inside": "outside", "above": "below", "front": "back", "north": "south", "east": "west",
    "day": "night", "summer": "winter", "rich": "poor", "strong": "weak", "loud": "quiet",
    "thick": "thin", "wide": "narrow", "deep": "shallow", "sharp": "blunt", "clean": "dirty",
    "true": "false", "friend": "enemy", "love": "hate", "asleep": "awake", "sweet": "sour",
    "smooth": "rough", "cheap": "expensive", "question": "answer", "maximum": "minimum",
    "increase": "decrease", "accept": "refuse", "remember": "forget", "enter": "exit",
    "ancient": "modern", "safe": "dangerous", "absent": "present", "import": "export",
    "happy": "sad", "open": "closed", "fast": "slow", "big": "small", "hard": "soft",
    "start": "finish", "brave": "cowardly",
}

ANIMAL_SOUNDS = {
    "dog": "bark", "cat": "meow", "cow": "moo", "sheep": "bleat", "horse": "neigh", "pig": "oink",
    "duck": "quack", "lion": "roar", "snake": "hiss", "owl": "hoot", "bee": "buzz", "frog": "croak",
    "donkey": "bray", "wolf": "howl", "mouse": "squeak", "rooster": "crow", "hen": "cluck",
    "turkey": "gobble", "elephant": "trumpet", "crow": "caw", "dove": "coo",
}

ANIMAL_YOUNG = {
    "dog": "puppy", "cat": "kitten", "cow": "calf", "sheep": "lamb", "horse": "foal", "pig": "piglet",
    "duck": "duckling", "goose": "gosling", "lion": "cub", "bear": "cub", "frog": "tadpole",
    "kangaroo": "joey", "deer": "fawn", "goat": "kid", "swan": "cygnet", "owl": "owlet",
    "eagle": "eaglet", "hen": "chick", "butterfly": "caterpillar",
}

PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "goose": "geese",
    "man": "men", "woman": "women", "person": "people", "ox": "oxen", "cactus": "cacti",
    "louse": "lice", "knife": "knives", "wolf": "wolves", "leaf": "leaves", "half": "halves",
    "crisis": "crises", "analysis": "analyses", "phenomenon": "phenomena", "criterion": "criteria",
    "life": "lives",
}

POLYGON_SIDES = {"triangle": "3", "square": "4", "pentagon": "5", "hexagon": "6", "heptagon": "7",
                 "octagon": "8", "nonagon": "9", "decagon": "10", "dodecagon": "12"}

PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]

##### question builders #########################################################################


def _question(rng: random.Random, category: str, question: str, answer: str, pool: list[str]) -> dict:
    """One row: the answer plus three distinct distractors from `pool`, in a seeded order."""
    others = sorted({p for p in pool if p != answer})
    choices = rng.sample(others, 3) + [answer]
    rng.shuffle(choices)
    return {"category": category, "question": question, "choices": choices, "answer": choices.index(answer)}


def _from_table(category: str, table: dict[str, str], template: str) -> list[dict]:
    rng = random.Random(category)
    pool = list(table.values())
    return [_question(rng, category, template.format(key), value, pool) for key, value in table.items()]


def _near_misses(rng: random.Random, answer: int, candidates: list[int]) -> list[str]:
    """Three distinct plausible wrong numbers (positive, not the answer), as strings."""
    wrong = sorted({c for c in candidates if c > 0 and c != answer})
    return [str(c) for c in rng.sample(wrong, 3)]


def _arithmetic() -> list[dict]:
    rng = random.Random("arithmetic")
    rows = []
    for _ in range(25):
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        wrong = _near_misses(rng, a + b, [a + b + d for d in (-10, -2, -1, 1, 2, 10)])
        rows.append((f"What is {a} plus {b}?", a + b, wrong))
    for _ in range(20):
        a, b = rng.randint(20, 90), rng.randint(2, 19)
        wrong = _near_misses(rng, a - b, [a - b + d for d in (-10, -2, -1, 1, 2, 10)])
        rows.append((f"What is {a} minus {b}?", a - b, wrong))
    for _ in range(25):
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        # neighbouring products: the mistakes people make with times tables
        wrong = _near_misses(rng, a * b, [a * (b + 1), a * (b - 1), (a + 1) * b, (a - 1) * b, a * b + 1])
        rows.append((f"What is {a} times {b}?", a * b, wrong))
    out = []
    for question, answer, wrong in rows:
        choices = wrong + [str(answer)]
        rng.shuffle(choices)
        out.append({"category": "arithmetic", "question": question, "choices": choices,
                    "answer": choices.index(str(answer))})
    return out


def _calendar() -> list[dict]:
    rng = random.Random("calendar")
    rows = []
    for i, month in enumerate(MONTHS):
        rows.append(_question(rng, "calendar", f"Which month comes after {month}?", MONTHS[(i + 1) % 12], MONTHS))
        rows.append(_question(rng, "calendar", f"Which month comes before {month}?", MONTHS[i - 1], MONTHS))
    for i, day in enumerate(WEEKDAYS):
        rows.append(_question(rng, "calendar", f"Which day comes after {day}?", WEEKDAYS[(i + 1) % 7], WEEKDAYS))
        rows.append(_question(rng, "calendar", f"Which day comes before {day}?", WEEKDAYS[i - 1], WEEKDAYS))
    days = sorted(set(DAYS_IN_MONTH.values())) + ["29"]  # 28, 30, 31 and 29: exactly 3 wrong each
    for month, n in DAYS_IN_MONTH.items():
        q = f"How many days are there in {month}" + (" in a common year?" if month == "February" else "?")
        rows.append(_question(rng, "calendar", q, n, days))
    return rows


def _planets() -> list[dict]:
    rng = random.Random("planets")
    return [_question(rng, "planets", f"Which planet is {ORDINALS[i]} from the Sun?", p, PLANETS)
            for i, p in enumerate(PLANETS)]


def build() -> list[dict]:
    """Every question, categories interleaved in a seeded order, each with a stable id.

    Interleaved so that lm-eval's `limit=N` (the first N rows) is a mix of every category, not
    the first two tables."""
    rows = (
        _from_table("capital", CAPITALS, "What is the capital of {}?")
        + _from_table("element", ELEMENT_SYMBOLS, "What is the chemical symbol for {}?")
        + _arithmetic()
        + _from_table("units", UNITS, "How many {}?")
        + _calendar()
        + _from_table("opposite", OPPOSITES, "What is the opposite of \"{}\"?")
        + _from_table("animal_sound", ANIMAL_SOUNDS, "What sound does a {} make?")
        + _from_table("animal_young", ANIMAL_YOUNG, "What is a young {} called?")
        + _from_table("plural", PLURALS, "What is the plural of \"{}\"?")
        + _from_table("shape", POLYGON_SIDES, "How many sides does a {} have?")
        + _planets()
    )
    random.Random("order").shuffle(rows)
    return [{"id": f"{r['category']}-{i:03d}", **r} for i, r in enumerate(rows)]


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


if __name__ == "__main__":
    rows = build()
    OUT.write_text(render(rows), encoding="utf-8")
    print(f"wrote {len(rows)} questions to {OUT}")
