"""Where the test and benchmark data lives: the real Multi30k beside the project, or a
tiny built-in German-English sample written on demand (so tests and benchmarks run on any
fresh clone). Test support, not part of the library: benchmarks import it from here."""

from __future__ import annotations

import os
from pathlib import Path

from aiayn.data.datasets import cache_dir

ROOT = Path(__file__).resolve().parents[1]  # tests/sample_data.py -> project root

PAIRS = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bike."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ("Ein Kind isst einen Apfel.", "A child eats an apple."),
    ("Ein Mann spielt Gitarre.", "A man plays guitar."),
    ("Eine Frau trinkt Kaffee.", "A woman drinks coffee."),
    ("Drei Kinder laufen am Strand.", "Three children run on the beach."),
    ("Ein Hund rennt über die Wiese.", "A dog runs across the meadow."),
    ("Ein Junge springt ins Wasser.", "A boy jumps into the water."),
    ("Ein Mädchen lacht.", "A girl laughs."),
    ("Ein Mann kocht in der Küche.", "A man cooks in the kitchen."),
    ("Eine Frau fährt ein rotes Auto.", "A woman drives a red car."),
    ("Zwei Männer sitzen auf einer Bank.", "Two men sit on a bench."),
    ("Ein Hund schläft auf dem Sofa.", "A dog sleeps on the sofa."),
    ("Ein Kind malt ein Bild.", "A child paints a picture."),
    ("Ein Mann liest eine Zeitung.", "A man reads a newspaper."),
    ("Eine Frau spielt Klavier.", "A woman plays the piano."),
    ("Zwei Kinder spielen Fußball.", "Two children play soccer."),
    ("Ein Junge fährt Skateboard.", "A boy rides a skateboard."),
    ("Ein Mädchen trägt ein blaues Kleid.", "A girl wears a blue dress."),
    ("Ein Mann geht mit seinem Hund spazieren.", "A man walks his dog."),
    ("Eine Frau kauft Obst auf dem Markt.", "A woman buys fruit at the market."),
    ("Ein Arbeiter repariert eine Straße.", "A worker repairs a road."),
    ("Zwei Frauen unterhalten sich.", "Two women talk to each other."),
    ("Ein Kind schwimmt im See.", "A child swims in the lake."),
    ("Ein Mann klettert auf einen Felsen.", "A man climbs a rock."),
    ("Eine Gruppe von Menschen tanzt.", "A group of people dance."),
    ("Ein schwarzer Hund fängt einen Ball.", "A black dog catches a ball."),
    ("Ein Mann mit Hut sitzt im Park.", "A man with a hat sits in the park."),
    ("Eine Frau hält ein Baby.", "A woman holds a baby."),
    ("Ein Junge wirft einen Stein.", "A boy throws a stone."),
    ("Zwei Hunde laufen durch das Gras.", "Two dogs run through the grass."),
    ("Ein Mann fährt ein Boot.", "A man steers a boat."),
    ("Eine Frau läuft im Regen.", "A woman walks in the rain."),
    ("Ein Kind spielt mit einem Ball.", "A child plays with a ball."),
    ("Ein Mann singt auf der Bühne.", "A man sings on stage."),
    ("Eine Frau fotografiert die Stadt.", "A woman photographs the city."),
    ("Drei Männer arbeiten auf dem Dach.", "Three men work on the roof."),
    ("Ein Mädchen füttert eine Katze.", "A girl feeds a cat."),
    ("Ein alter Mann sitzt am Fenster.", "An old man sits at the window."),
    ("Ein Hund springt über einen Zaun.", "A dog jumps over a fence."),
    ("Eine Frau schneidet Gemüse.", "A woman cuts vegetables."),
    ("Zwei Jungen fahren Fahrrad.", "Two boys ride bikes."),
    ("Ein Mann trägt eine Kiste.", "A man carries a box."),
    ("Eine Frau wartet auf den Bus.", "A woman waits for the bus."),
    ("Ein Kind baut eine Sandburg.", "A child builds a sandcastle."),
    ("Ein Mann angelt am Fluss.", "A man fishes at the river."),
    ("Eine Frau joggt im Park.", "A woman jogs in the park."),
    ("Zwei Kinder essen Eis.", "Two children eat ice cream."),
    ("Ein Hund bellt eine Katze an.", "A dog barks at a cat."),
    ("Ein Mann schreibt an eine Tafel.", "A man writes on a board."),
    ("Eine Frau gießt die Blumen.", "A woman waters the flowers."),
    ("Ein Junge spielt Basketball.", "A boy plays basketball."),
    ("Ein Mädchen reitet ein Pferd.", "A girl rides a horse."),
    ("Zwei Männer spielen Schach.", "Two men play chess."),
    ("Eine Frau trägt eine Tasche.", "A woman carries a bag."),
    ("Ein Kind schläft im Bett.", "A child sleeps in bed."),
    ("Ein Mann putzt das Fenster.", "A man cleans the window."),
    ("Eine Familie sitzt am Tisch.", "A family sits at the table."),
    ("Ein Radfahrer fährt einen Hügel hinauf.", "A cyclist rides up a hill."),
    ("Ein Hund trägt einen Stock.", "A dog carries a stick."),
    ("Eine Frau lächelt in die Kamera.", "A woman smiles at the camera."),
    ("Zwei Mädchen springen Seil.", "Two girls jump rope."),
    ("Ein Mann wartet an der Ampel.", "A man waits at the traffic light."),
    ("Ein Kind klettert auf einen Baum.", "A child climbs a tree."),
    ("Eine Frau verkauft Blumen.", "A woman sells flowers."),
    ("Ein Junge liest ein Comicheft.", "A boy reads a comic book."),
    ("Ein Mann repariert ein Fahrrad.", "A man repairs a bicycle."),
    ("Eine Gruppe wandert in den Bergen.", "A group hikes in the mountains."),
    ("Ein Hund schwimmt im Wasser.", "A dog swims in the water."),
]


# The user's cache of `aiayn data get`, as it was before conftest.py moved AIAYN_DATA to a
# folder of the test session's own (so that no test writes into the user's cache).
USER_CACHE = cache_dir()

# Test files (tests/test_x.py) that read Multi30k in this session: conftest.py checks
# that each is marked ``multi30k``, the mark CI uses to run them again without the data.
READERS: set[str] = set()


def multi30k_dir() -> Path | None:
    """The Multi30k folder ($AIAYN_MULTI30K, else ../shared/data/multi30k beside the
    project, else the cache of `aiayn data get multi30k`) if it holds the de and en
    train/val/test2016 files, else None. ``AIAYN_MULTI30K=none`` hides it, to run the tests
    as on a fresh clone without the data."""
    if os.environ.get("AIAYN_MULTI30K") == "none":
        return None
    candidates = [
        os.environ.get("AIAYN_MULTI30K"),
        ROOT.parent / "shared/data/multi30k",
        USER_CACHE / "multi30k",
    ]
    for c in candidates:
        if c and all(
            (Path(c) / f"{s}.{lang}.gz").is_file()
            for s in ("train", "val", "test2016")
            for lang in ("de", "en")
        ):
            test = os.environ.get("PYTEST_CURRENT_TEST")
            if test:
                READERS.add(test.split("::")[0])
            return Path(c)
    return None


def write_sample(directory: str | Path) -> dict[str, Path]:
    """Write the built-in pairs as train (first 50) / val (next 10) / test (last 10) files
    ``{split}.de`` and ``{split}.en``; returns ``{"train.de": path, ...}``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits = {"train": PAIRS[:50], "val": PAIRS[50:60], "test": PAIRS[60:]}
    paths = {}
    for split, pairs in splits.items():
        for side, lang in ((0, "de"), (1, "en")):
            path = directory / f"{split}.{lang}"
            path.write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
            paths[f"{split}.{lang}"] = path
    return paths
