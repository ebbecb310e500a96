"""posenc-bench list: registered encodings, one line each: name, family, summary, paper."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    return sub.add_parser("list", help="registered encodings, one line each")


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench import encodings

    names = encodings.available()
    window_row, sink_row = "<name>+sw<W>", "<name>+sink<S>+sw<W>"
    width = max(map(len, names + [window_row, sink_row]))
    family_width = max(len(encodings.get_class(n).family) for n in names)
    for name in names:
        cls = encodings.get_class(name)
        verb = "fine-tunes, then evaluates," if cls.finetuned else "evaluates"
        extra = f" [{verb} the trained {cls.trained_as!r} model]" if cls.trained_as else ""
        print(f"{name:<{width}}  {cls.family:<{family_width}}  {cls.summary}{extra} -- {cls.paper}")
    print(f"{window_row:<{width}}  {'':<{family_width}}  any of the above with sliding-window attention over the "
          "last W tokens")
    print(f"{sink_row:<{width}}  {'':<{family_width}}  a trained encoding's model, zero-shot, with a window of W keys "
          "plus the first S tokens, positions re-indexed in the cache (StreamingLLM; <name>+sw<W>+sink<S>: the "
          "model trained with that window) -- Xiao et al., ICLR 2024 (arXiv:2309.17453)")
    return 0
