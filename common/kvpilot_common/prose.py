"""Natural text read from what every Python install carries, for `kvpilot eval`'s perplexity and
`kvpilot bench`'s prompts: nothing is copied into the repository or downloaded."""


def default_text() -> str:
    """Prose paragraphs of the Python reference documentation that ships with every CPython."""
    from pydoc_data.topics import topics

    paragraphs = [p for key in sorted(topics) for p in topics[key].split("\n\n")]
    prose = [
        " ".join(p.split())
        for p in paragraphs
        if len(p) > 200 and not p[0].isspace() and "::=" not in p and ">>>" not in p
    ]
    return "\n\n".join(prose)
