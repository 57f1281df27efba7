"""Open-domain chat prompts for drafter training: writing, role-play, explanations, comparisons and
extraction from a given text, the kinds of request a chat assistant gets besides code and math.

Why: a drafter trained on the target's answers to code, math and standard-library prompts gained
chain tau on HumanEval (2.77 -> 3.60) and none on MT-Bench turn 1 (1.93 -> 1.93), whose answers
are prose of other kinds (results/drafter-distill/README.md). The prompts here are made from
templates over the word lists below, written for this module, not taken from any prompt set; the
overlap guard (taps.train.overlap) still checks every one against the evaluation sets.

`chat_prompts(seed)` yields distinct prompts in a seeded order that depends on nothing but the
seed (no files, no packages), so it is the same on every machine and prefix-stable. Its kinds
take turns by CHAT_KIND_WEIGHTS; extraction never runs out (each draws a new text), the others
run out after the distinct prompts `chat_sizes()` counts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

FORMS = (
    "a blog post", "a short story", "a poem", "a persuasive essay", "a product description", "a formal email",
    "a short speech", "a letter to a friend", "a review", "a news article", "a dialogue between two people",
    "a motivational message", "a social media post", "a diary entry",
)  # fmt: skip
SUBJECTS = (
    "a rainy morning in a big city", "learning to cook at forty", "the first day at a new job", "a lost cat",
    "moving to another country", "a community garden", "an old lighthouse", "a mountain hike gone wrong",
    "a small bakery that opens at dawn", "the value of public libraries", "a robot that wants to paint",
    "a winter festival", "a train journey across a desert", "volunteering at an animal shelter",
    "a grandmother's recipe book", "the last day of summer holidays", "a noisy neighbour", "a chess tournament",
    "a village without electricity", "saving money on groceries", "a surprise birthday party",
    "working from home", "a bicycle repair shop", "a river that floods every spring", "an underwater city",
    "a forgotten music instrument", "a marathon runner's last race", "a school science fair",
    "a friendship that began online", "a storm at sea", "the benefits of walking every day",
    "a street market at night", "a new electric car", "a smartphone that lasts a week", "a museum after closing",
    "a farmer's first harvest", "a teenager's first concert", "a hot-air balloon ride", "a broken umbrella",
    "learning a language late in life", "a family road trip", "a detective who is afraid of the dark",
    "a city park in autumn", "an astronaut's first night in orbit", "a pair of hiking boots",
    "a coffee shop for remote workers", "the importance of sleep", "a wedding in the rain",
    "a neighbourhood clean-up day", "a talking parrot", "a cooking competition", "a lighthouse keeper's letter",
    "a solar-powered boat", "recycling at home", "a quiet island", "an ancient map", "a jazz club",
    "a snow day", "a newly opened bookshop", "a long-distance phone call",
)  # fmt: skip
CONSTRAINTS = (
    "", " Keep it under 150 words.", " Use a humorous tone.", " Write it for a ten-year-old reader.",
    " End with a surprising twist.", " Use exactly three paragraphs.", " Make it formal and concise.",
    " Include at least one question to the reader.",
)  # fmt: skip
PERSONAS = (
    "a ship's captain in the 1800s", "a kindergarten teacher", "a medieval blacksmith", "a travel guide in Rome",
    "a personal fitness coach", "a nervous first-time pilot", "a detective in 1920s London", "a bakery owner",
    "a museum curator", "a retired astronaut", "a wildlife photographer", "a customer support agent",
    "a stand-up comedian", "a marathon coach", "a librarian", "a chef in a busy restaurant", "a park ranger",
    "a job interviewer", "a famous novelist", "a wise old wizard", "a car mechanic", "a nutritionist",
    "a tour guide on a volcano", "a high-school principal", "a street musician", "a news anchor",
    "a gardener", "a film director", "a lighthouse keeper", "a sports commentator",
)  # fmt: skip
ROLE_REQUESTS = (
    "Introduce yourself and describe a typical day.",
    "Give three pieces of advice to someone starting out in your line of work.",
    "What is the hardest part of what you do, and how do you cope with it?",
    "Tell a short story about the most memorable moment of your career.",
    "A visitor asks you what makes your job worth doing. Answer them.",
    "Explain to a beginner one skill you use every day.",
    "Someone complains that your work is easy. Respond politely but firmly.",
    "Describe the tools you rely on and why.",
)  # fmt: skip
CONCEPTS = (
    "photosynthesis", "inflation", "supply and demand", "the water cycle", "plate tectonics", "vaccination",
    "the greenhouse effect", "compound interest", "natural selection", "the Renaissance", "the printing press",
    "the Industrial Revolution", "democracy", "the scientific method", "black holes", "the immune system",
    "opportunity cost", "the Roman Empire", "impressionist painting", "the theory of relativity",
    "renewable energy", "the human heart", "ocean tides", "the placebo effect", "cognitive biases",
    "the Silk Road", "the French Revolution", "game theory", "machine learning", "DNA replication",
    "the Cold War", "stoic philosophy", "the stock market", "antibiotic resistance", "the Big Bang",
    "urbanization", "the nervous system", "globalization", "volcanic eruptions", "the history of jazz",
    "carbon dating", "electric circuits", "the ozone layer", "the Enlightenment", "public health",
    "probability", "the novel as a literary form", "climate change", "social contract theory", "the Moon landing",
)  # fmt: skip
CONCEPT_TEMPLATES = (
    "Explain {c} in simple terms.",
    "What are common misconceptions about {c}?",
    "How would you teach {c} to a high-school student? Outline a short lesson.",
    "Describe how {c} affects everyday life, with examples.",
    "Write a short quiz of five questions about {c}, with answers.",
    "Summarize the key ideas of {c} in five bullet points.",
)  # fmt: skip
PAIRS = (
    ("renting", "buying a home"), ("trains", "planes for travel in Europe"), ("cats", "dogs as pets"),
    ("reading books", "listening to audiobooks"), ("city life", "country life"), ("solar", "wind power"),
    ("working alone", "working in a team"), ("tea", "coffee"), ("online", "in-person classes"),
    ("saving", "investing"), ("paper notebooks", "note-taking apps"), ("running", "swimming for fitness"),
    ("capitalism", "socialism"), ("Stoicism", "Epicureanism"), ("classical", "operant conditioning"),
    ("weather", "climate"), ("viruses", "bacteria"), ("mitosis", "meiosis"), ("monarchy", "republic"),
    ("realism", "romanticism in painting"),
)  # fmt: skip
PAIR_TEMPLATES = (
    "Compare {a} and {b}: strengths, weaknesses, and when to choose each.",
    "Give a balanced argument for and against {a} compared with {b}.",
)
NAMES = ("Alice", "Bilal", "Chen", "Dana", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Luis",
         "Maya", "Noah", "Olga", "Priya", "Quentin", "Rosa", "Sven", "Tariq")  # fmt: skip
ITEMS = ("notebooks", "desk lamps", "coffee mugs", "backpacks", "headphones", "umbrellas", "water bottles",
         "chairs", "keyboards", "plant pots")  # fmt: skip
CITIES = ("Lisbon", "Nairobi", "Osaka", "Denver", "Krakow", "Lima", "Hanoi", "Oslo", "Cairo", "Perth")
EXTRACT_TASKS = (
    "Return these orders as a JSON list with the keys name, city, quantity, item and price.",
    "Which customer spent the most in total? Show the arithmetic.",
    "Turn these orders into a Markdown table sorted by price.",
    "Summarize these orders in two sentences for a sales manager.",
    "List the cities mentioned and how many items were shipped to each.",
)  # fmt: skip
CHAT_KIND_WEIGHTS = {"writing": 0.35, "roleplay": 0.2, "concept": 0.3, "compare": 0.05, "extraction": 0.1}


def _writing() -> list[str]:
    return [f"Write {form} about {subject}.{constraint}"
            for form, subject, constraint in itertools.product(FORMS, SUBJECTS, CONSTRAINTS)]


def _roleplay() -> list[str]:
    return [f"Imagine you are {p}. {r}" for p, r in itertools.product(PERSONAS, ROLE_REQUESTS)]


def _concept() -> list[str]:
    return [t.format(c=c) for c, t in itertools.product(CONCEPTS, CONCEPT_TEMPLATES)]


def _compare() -> list[str]:
    return [t.format(a=a, b=b) for (a, b), t in itertools.product(PAIRS, PAIR_TEMPLATES)]


def _extraction(rng: random.Random) -> Iterator[str]:
    """A new list of orders each time (names, cities, items, numbers drawn), with a task over it."""
    while True:
        lines = [f"- {rng.choice(NAMES)} from {rng.choice(CITIES)} ordered {rng.randint(2, 12)} "
                 f"{rng.choice(ITEMS)} at ${rng.randint(3, 90)}.{rng.randint(0, 99):02d} each."
                 for _ in range(rng.randint(3, 6))]
        yield "Here are this week's orders:\n" + "\n".join(lines) + "\n\n" + rng.choice(EXTRACT_TASKS)


FINITE_KINDS = {"writing": _writing, "roleplay": _roleplay, "concept": _concept, "compare": _compare}


def chat_prompts(seed: int) -> Iterator[str]:
    """Chat prompts in a seeded, machine-independent order (see the module docstring)."""
    rng = random.Random(f"{seed}:chat")
    streams: dict[str, Iterator[str]] = {}
    for kind, make in FINITE_KINDS.items():
        prompts = make()
        rng.shuffle(prompts)
        streams[kind] = iter(prompts)
    streams["extraction"] = _extraction(random.Random(f"{seed}:chat:extraction"))
    while streams:
        kinds = sorted(streams)
        kind = rng.choices(kinds, weights=[CHAT_KIND_WEIGHTS[k] for k in kinds])[0]
        try:
            yield next(streams[kind])
        except StopIteration:
            del streams[kind]


def chat_sizes() -> dict[str, int | None]:
    """Distinct prompts of each kind (None: unlimited)."""
    return {**{k: len(set(make())) for k, make in FINITE_KINDS.items()}, "extraction": None}
