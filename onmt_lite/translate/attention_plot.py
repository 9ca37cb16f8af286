"""Attention as pictures (-attn_plot, ``python -m onmt_lite plot``): one PNG heatmap per sentence,
source tokens along the top, target tokens down the side. Needs matplotlib (the ``plot`` extra).
"""
import os
from typing import List, Sequence, Tuple

CELL_INCHES = 0.22  # per token: 60-token sentences keep their labels readable
MARGIN_INCHES = 1.6  # room for the token labels
DPI = 100


class PlotError(ValueError):
    """Plotting cannot run (matplotlib missing, a folder or picture that cannot be written)."""


def require_matplotlib() -> None:
    """Raises PlotError with the install command when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError("attention plots need matplotlib: pip install 'onmt_lite[plot]' "
                        "(or pip install matplotlib)") from None


def image_size(src_len: int, tgt_len: int) -> Tuple[int, int]:
    """(width, height) in pixels of the picture of a tgt_len x src_len matrix."""
    width = MARGIN_INCHES + CELL_INCHES * max(src_len, 4)
    height = MARGIN_INCHES + CELL_INCHES * max(tgt_len, 4)
    return round(width * DPI), round(height * DPI)


def plot_attention(src: Sequence[str], pred: Sequence[str], attention: List[List[float]],
                   path: str) -> None:
    """Writes the heatmap of ``attention`` (len(pred) rows, len(src) columns) to ``path``;
    PlotError names the picture that cannot be written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = image_size(len(src), len(pred))
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    # the axes fill the figure less the label margin (left and top hold the tokens)
    margin_w, margin_h = MARGIN_INCHES * DPI / width, MARGIN_INCHES * DPI / height
    axes = figure.add_axes((margin_w, 0.1 * margin_h, 1 - 1.1 * margin_w, 1 - 1.1 * margin_h))
    matrix = attention if attention and attention[0] else [[0.0]]  # an empty line: a blank
    axes.imshow(matrix, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto",
                interpolation="nearest")
    axes.xaxis.tick_top()
    # tokens are text, never TeX: "$x_$" would stop the drawing as bad mathtext
    axes.set_xticks(range(len(src)), labels=list(src), rotation=90, fontsize=8, parse_math=False)
    axes.set_yticks(range(len(pred)), labels=list(pred), fontsize=8, parse_math=False)
    try:
        figure.savefig(path, dpi=DPI)
    except OSError as err:
        raise PlotError(f"{path}: cannot write the picture: {err.strerror or err}") from None


def plot_path(folder: str, index: int) -> str:
    """The picture of input line ``index`` (0-based): ``folder/sentence_000001.png`` for the
    first line."""
    return os.path.join(folder, f"sentence_{index + 1:06d}.png")


def prepare_folder(folder: str) -> None:
    """Checks matplotlib and creates ``folder``; PlotError names the problem."""
    require_matplotlib()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise PlotError(f"{folder}: cannot create the plot folder: {err.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PlotError(f"{folder}: cannot write in the plot folder: permission denied")
