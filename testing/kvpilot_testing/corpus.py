"""Plain English, sliced into prompts of any length by the tests and the benchmarks (a real
tokenizer on real text gives the model realistic, well-separated next-token choices)."""

CORPUS = (
    "The river starts high in the mountains, where snow melts each spring and runs down "
    "through pine forests into a wide green valley. Farmers in the valley grow wheat, apples "
    "and potatoes, and every autumn they bring their harvest to the market in the old town. "
    "The town has a stone bridge, a library with a clock tower, and a small museum about the "
    "history of the railway that once carried timber to the coast. Children learn to swim in "
    "the lake during summer, and in winter the same lake freezes so thick that people skate "
    "on it for weeks. Scientists from the university measure the water every month to see "
    "how the climate is changing, and they publish their results in a short report that "
    "anyone can read. Tourists often ask the guides why the water is so cold and clear, and "
    "the guides explain that it comes straight from the glaciers above the tree line. "
)
