"""Chat templates from model files, rendered in the sandbox: any template and messages end in a
string or a TemplateError, within the time and size limits."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.prompt.template import Context, Message, render_text

ROLES = ("system", "user", "assistant", "tool")


def one(data: bytes) -> None:
    template, *rest = (part.decode("utf-8", "replace") for part in harness.parts(data, 6))
    messages = [Message(ROLES[len(m) % 4], m) for m in rest if m]  # the template, then up to 5 messages
    flags = len(template)
    context = Context("<s>", "</s>", bool(flags & 1), variables={"enable_thinking": bool(flags & 2)})
    text = render_text(template, messages, context)
    assert isinstance(text, str)


if __name__ == "__main__":
    harness.main(one)
