"""posenc-bench: how well do transformer positional encodings extrapolate past their train length?"""

__version__ = "0.1.0"
