"""The task mix of ``jaxspec bench --only real``: six categories of eight chat prompts each,
in the style of Spec-Bench (arXiv 2401.07851), written for this project.

Each prompt is a list of chat messages (``{"role", "content"}``) for the target's chat
template; the multi-turn prompts end on a user turn after earlier user and assistant turns.
The categories differ in how much of the answer can be copied from the prompt (summaries and
answers from a context copy much, translation and code some, chat and math little), which
is what moves a drafter's acceptance::

    from jaxspec.bench.tasks import TASKS
    TASKS["code"][0]      # [{"role": "user", "content": "Write a Python function ..."}]

These prompts are held out from the drafter's training instructions
(:mod:`jaxspec.training.instructions`; tests/test_tasks.py checks that none is shared).
"""

from __future__ import annotations

__all__ = ["CATEGORIES", "TASKS", "messages_of"]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _turns(*texts: str) -> list[dict[str, str]]:
    """Alternating user / assistant turns, starting and ending with the user."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


_PASSAGES = (
    "The Great Barrier Reef is the world's largest coral reef system, made of nearly three thousand "
    "individual reefs and nine hundred islands stretching over 2,300 kilometres off the coast of "
    "Queensland, Australia. It can be seen from outer space and is built by billions of tiny organisms "
    "known as coral polyps. The reef supports a wide diversity of life and was selected as a World "
    "Heritage Site in 1981. Rising sea temperatures have caused several mass bleaching events since "
    "1998, in which corals expel the algae living in their tissues and turn white.",
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light energy "
    "into chemical energy. Inside the chloroplasts, chlorophyll absorbs mostly blue and red light. "
    "The light-dependent reactions split water, releasing oxygen, and produce ATP and NADPH. The "
    "Calvin cycle then uses that energy to fix carbon dioxide from the air into sugars, which the "
    "plant uses to grow and to store energy.",
    "The printing press with movable type was developed in Europe by Johannes Gutenberg around 1440. "
    "Before it, books were copied by hand, which made them rare and expensive. The press allowed "
    "the fast production of identical copies, lowered the price of books, and helped spread literacy, "
    "new scientific ideas and the Protestant Reformation across Europe within a few decades.",
    "A hash table stores key-value pairs in an array of buckets. A hash function turns each key into "
    "an index; when two keys land in the same bucket, a collision, the table either keeps a short list "
    "in that bucket or probes for another free slot. With a good hash function and a load factor kept "
    "below a fixed bound by resizing, lookups, insertions and deletions take constant time on average.",
)

_CONTEXTS = (
    ("The library opens at 9 a.m. on weekdays and at 10 a.m. on Saturdays. It is closed on Sundays "
     "and public holidays. Members may borrow up to eight books for three weeks, and renew them twice "
     "online unless another member has reserved them. Late returns cost 20 cents per book per day.",
     "How many books can a member borrow, and for how long?"),
    ("Mount Kilimanjaro, in Tanzania, is the highest mountain in Africa at 5,895 metres. It is a "
     "dormant volcano with three cones: Kibo, Mawenzi and Shira. The first recorded ascent to the "
     "summit was made in 1889 by Hans Meyer and Ludwig Purtscheller.",
     "Who first reached the summit of Kilimanjaro, and in which year?"),
    ("To reset the router, keep it plugged in and press the small button on the back with a paper clip "
     "for ten seconds, until the front light blinks orange. The router then restarts with its factory "
     "settings: the network name and password printed on the label under the device.",
     "What happens after I hold the reset button for ten seconds?"),
    ("Marie Curie was born in Warsaw in 1867 and moved to Paris in 1891 to study physics and "
     "mathematics. With Pierre Curie she discovered polonium and radium. She won the Nobel Prize in "
     "Physics in 1903, shared with Pierre Curie and Henri Becquerel, and the Nobel Prize in Chemistry "
     "alone in 1911.",
     "Which Nobel Prizes did Marie Curie win, and did she share them?"),
    ("The train from Lyon to Geneva leaves at 7:42 and arrives at 9:36. A second train leaves at 12:15 "
     "and arrives at 14:05. Tickets bought online at least a week in advance cost 19 euros; at the "
     "station they cost 34 euros. Bicycles travel free on both trains if booked.",
     "How long does the morning train take, and how much do I save by buying online early?"),
    ("Our return policy: unused items can be returned within 30 days of delivery for a full refund. "
     "Sale items can only be exchanged, not refunded. Shipping costs for returns are paid by the "
     "customer, except when the item arrived damaged, in which case we send a prepaid label.",
     "I bought a jacket on sale and it arrived torn. What can I do and who pays for shipping?"),
    ("The city council voted on Tuesday to turn Elm Street into a pedestrian zone from June to "
     "September. Delivery vans will be allowed before 10 a.m. The council expects the change to reduce "
     "noise and to help the cafes along the street, though some shop owners worry about losing "
     "customers who arrive by car.",
     "When will Elm Street be closed to cars, and what are the worries about it?"),
    ("Sourdough bread is leavened by a starter: a mix of flour and water colonised by wild yeast and "
     "lactic acid bacteria. The bacteria give the bread its sour taste. A starter is fed with fresh "
     "flour and water every day; it is ready to use when it doubles in size within four to six hours "
     "after a feeding.",
     "What makes sourdough taste sour, and how do I know my starter is ready?"),
)

#: category -> eight prompts (lists of chat messages), in a fixed order
TASKS: dict[str, list[list[dict[str, str]]]] = {
    "chat": [
        _turns("I just moved to a new city and I don't know anyone.",
               "That can feel lonely at first. Many people meet others through clubs, classes or volunteering.",
               "What kind of clubs would you suggest for someone who likes the outdoors?"),
        _turns("Can you help me plan a dinner for six friends?",
               "Of course! Do any of your friends have dietary restrictions?",
               "One is vegetarian. What would be a good main course everyone can eat?"),
        _turns("I want to start running.", "Great idea! Have you run before, or are you starting from zero?",
               "From zero. How often should I run in the first month?"),
        _turns("What's a good way to learn to play the guitar?",
               "Many people start with a few basic chords and simple songs, and practise a little every day.",
               "Which chords should I learn first?"),
        _turns("My tomato plants have yellow leaves.",
               "Yellow leaves can come from too much water, too little nitrogen, or a disease.",
               "I water them every day. Could that be the problem?"),
        _turns("I'm nervous about a job interview tomorrow.",
               "That's normal. Preparing a few stories about your past work can help a lot.",
               "How should I answer when they ask about my biggest weakness?"),
        _turns("Recommend me a book to read on holiday.",
               "Do you prefer fiction or non-fiction, and do you like long books?",
               "Fiction, something light and funny, not too long."),
        _turns("How do I keep my houseplants alive while I travel for two weeks?",
               "You could ask a neighbour, group the plants together, or use self-watering spikes.",
               "I have no neighbour to ask. How do self-watering spikes work?"),
    ],
    "code": [
        _user("Write a Python function that returns the n-th Fibonacci number iteratively."),
        _user("Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."),
        _user("Write a Python function that counts how many times each word appears in a text and returns a dict."),
        _user("Write a Python function that merges two sorted lists into one sorted list."),
        _user("Write a Python class Stack with push, pop and is_empty methods."),
        _user("Write a Python function that reads a CSV file and returns the sum of its second column."),
        _user("Write a JavaScript function that removes duplicate values from an array."),
        _user("Write a Python function that returns all prime numbers below n using the sieve of Eratosthenes."),
    ],
    "math": [
        _user("A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain step by step."),
        _user("Tom is 4 years older than his sister. In 6 years their ages will add up to 30. How old is Tom now? "
              "Show your reasoning."),
        _user("A train travels 180 km in 2 hours and 15 minutes. What is its average speed in km/h? Show the steps."),
        _user("What is 15% of 240? Explain how you compute it."),
        _user("A rectangle has a perimeter of 36 cm and its length is twice its width. Find its area, step by step."),
        _user("If 5 workers build a wall in 12 days, how many days do 8 workers need at the same rate? "
              "Explain your reasoning."),
        _user("Solve for x: 3x + 7 = 2x - 5. Show each step."),
        _user("A bag holds 4 red and 6 blue marbles. Two are drawn without replacement. What is the probability "
              "that both are red? Show the steps."),
    ],
    "summary": [_user(f"Summarize the following passage in two sentences.\n\n{p}") for p in _PASSAGES]
    + [_user(f"Give a one-sentence summary of this text.\n\n{p}") for p in _PASSAGES],
    "context": [_user(f"Answer the question using only the text below.\n\nText: {c}\n\nQuestion: {q}")
                for c, q in _CONTEXTS],
    "translation": [
        _user("Translate into French: The weather is nice today, so we are going to have lunch in the park."),
        _user("Translate into Spanish: I would like to book a table for two people at eight o'clock tonight."),
        _user("Translate into German: The meeting has been moved to Thursday afternoon because of the holiday."),
        _user("Translate into French: My brother lives in a small village near the sea and works as a teacher."),
        _user("Translate into Spanish: Please turn off the lights when you leave the room."),
        _user("Translate into German: We visited the museum yesterday and saw many old paintings."),
        _user("Translate into Italian: Where is the nearest train station, and how long does it take to walk there?"),
        _user("Translate into English: Je voudrais apprendre à jouer du piano, mais je n'ai pas beaucoup de temps."),
    ],
}

#: the categories, in the order tables and plots show them
CATEGORIES: tuple[str, ...] = tuple(TASKS)


def messages_of(category: str) -> list[list[dict[str, str]]]:
    """The eight prompts of ``category`` (one of :data:`CATEGORIES`)."""
    if category not in TASKS:
        raise ValueError(f"messages_of: category = {category!r}; expected one of {list(CATEGORIES)}")
    return TASKS[category]
