"""Writing a benchmark's figure: laid out, its folder made, saved, and closed so that a long run
of plots does not keep every figure in memory."""

import os

import matplotlib.pyplot as plt


def save_figure(fig, path: str, dpi: int = 90) -> None:
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
