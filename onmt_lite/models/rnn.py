"""RNN encoder (optionally bidirectional) and input-feeding attention decoder."""
from typing import Dict, Optional, Tuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from onmt_lite.models.attention import GlobalAttention
from onmt_lite.models.state import StateFn, map_state, new_state


def padding_mask(src_len: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) lengths -> (B, 1, S) mask, True at padded positions."""
    positions = torch.arange(max_len, device=src_len.device)
    return (positions.unsqueeze(0) >= src_len.unsqueeze(1)).unsqueeze(1)


class RNNEncoder(nn.Module):
    """Embeddings and a (bi)directional LSTM/GRU; returns states and the final hidden state."""

    def __init__(self, vocab_size: int, pad: int, rnn_type: str, bidirectional: bool,
                 layers: int, hidden_size: int, word_vec_size: int, dropout: float):
        super().__init__()
        directions = 2 if bidirectional else 1
        if hidden_size % directions:
            raise ValueError("brnn needs an even hidden_size")
        self.bidirectional = bidirectional
        self.embeddings = nn.Embedding(vocab_size, word_vec_size, padding_idx=pad)
        self.dropout = nn.Dropout(dropout)
        rnn_class = {"LSTM": nn.LSTM, "GRU": nn.GRU}[rnn_type]
        self.rnn = rnn_class(word_vec_size, hidden_size // directions, num_layers=layers,
                             dropout=dropout if layers > 1 else 0.0,
                             bidirectional=bidirectional, batch_first=True)

    def forward(self, src: torch.Tensor, src_len: torch.Tensor):
        """src (B, S) -> memory (B, S, H) and final state, each (layers, B, H)."""
        emb = self.dropout(self.embeddings(src))
        packed = pack_padded_sequence(emb, src_len.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        finals = final if isinstance(final, tuple) else (final,)
        if self.bidirectional:  # (2*layers, B, H/2) -> (layers, B, H): concat directions
            finals = tuple(torch.cat([h[0::2], h[1::2]], dim=2) for h in finals)
        return memory, finals


def lstm_update(gates: torch.Tensor, cell: torch.Tensor, tanh=torch.tanh):
    """An LSTM cell's new hidden and cell state from its gate pre-activations (B, 4H)."""
    i, f, g, o = gates.chunk(4, dim=1)
    cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * tanh(g)
    return torch.sigmoid(o) * tanh(cell), cell


def gru_update(from_input: torch.Tensor, from_hidden: torch.Tensor, hidden: torch.Tensor,
               tanh=torch.tanh):
    """A GRU cell's new hidden state from its input's and its hidden state's products (B, 3H):
    the reset gate scales the hidden state's share of the candidate."""
    xr, xz, xn = from_input.chunk(3, dim=1)
    hr, hz, hn = from_hidden.chunk(3, dim=1)
    reset, update = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    new = tanh(xn + reset * hn)
    return new + update * (hidden - new)


class StackedCells(nn.Module):
    """A stack of LSTM or GRU cells for one decoding step, dropout between layers."""

    def __init__(self, rnn_type: str, layers: int, input_size: int, hidden_size: int,
                 dropout: float):
        super().__init__()
        cell = {"LSTM": nn.LSTMCell, "GRU": nn.GRUCell}[rnn_type]
        self.is_lstm = rnn_type == "LSTM"
        self.layers = nn.ModuleList(
            cell(input_size if i == 0 else hidden_size, hidden_size) for i in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor, cell: Optional[torch.Tensor]):
        new_h, new_c = [], []
        for i, layer in enumerate(self.layers):
            if self.is_lstm:
                h_i, c_i = layer(x, (hidden[i], cell[i]))
                new_c.append(c_i)
            else:
                h_i = layer(x, hidden[i])
            new_h.append(h_i)
            x = self.dropout(h_i) if i + 1 < len(self.layers) else h_i
        return x, torch.stack(new_h), torch.stack(new_c) if self.is_lstm else None


class InputFeedRNNDecoder(nn.Module):
    """Decoder whose input at each step is [embedding; previous attentional output]."""

    def __init__(self, vocab_size: int, pad: int, rnn_type: str, layers: int,
                 hidden_size: int, word_vec_size: int, attn_type: str, dropout: float):
        super().__init__()
        self.hidden_size = hidden_size
        self.embeddings = nn.Embedding(vocab_size, word_vec_size, padding_idx=pad)
        self.emb_dropout = nn.Dropout(dropout)
        self.rnn = StackedCells(rnn_type, layers, word_vec_size + hidden_size, hidden_size,
                                dropout)
        self.attn = GlobalAttention(hidden_size, attn_type)
        self.dropout = nn.Dropout(dropout)
        self.state: Dict[str, torch.Tensor] = {}
        self.group = 1  # decoder rows per row of the source entries (see state.py)

    STATE_DIMS = {"hidden": 1, "cell": 1}  # the others are batch-first
    SOURCE_KEYS = ("memory", "memory_proj", "src_mask")

    def init_state(self, src_len: torch.Tensor, memory: torch.Tensor, final: Tuple) -> None:
        """Starts decoding from the encoder's final state, with a zero input feed."""
        self.state = new_state(memory.size(0), memory.device)
        self.state.update(hidden=final[0],
                          input_feed=memory.new_zeros(memory.size(0), self.hidden_size),
                          memory=memory, src_mask=padding_mask(src_len, memory.size(1)))
        memory_proj = self.attn.project_memory(memory)
        if memory_proj is not None:
            self.state["memory_proj"] = memory_proj
        if len(final) > 1:
            self.state["cell"] = final[1]
        self.group = 1

    def map_state(self, fn: StateFn) -> None:
        """Applies ``fn(tensor, batch_dim)``, a selection of rows, to the state (see state.py)."""
        self.state, self.group = map_state(self.state, fn, self.STATE_DIMS,
                                           self.SOURCE_KEYS, self.group)

    def forward(self, tgt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Runs ``tgt`` (B, T) from the current state; returns outputs (B, T, H), attention (B, T, S)."""
        outputs, attns = [], []
        for emb_t in self.emb_dropout(self.embeddings(tgt)).unbind(1):
            out, attn = self._step(emb_t)
            outputs.append(out)
            attns.append(attn)
        return torch.stack(outputs, 1), torch.stack(attns, 1)

    def step(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One decoding step: tokens (B,) -> output (B, H), attention (B, S)."""
        return self._step(self.embeddings(tokens))

    def _step(self, emb: torch.Tensor):
        s = self.state
        rnn_in = torch.cat([emb, s["input_feed"]], dim=1)
        rnn_out, hidden, cell = self.rnn(rnn_in, s["hidden"], s.get("cell"))
        out, attn = self.attn(rnn_out.unsqueeze(1), s["memory"], s["src_mask"],
                              s.get("memory_proj"), self.group)
        out = self.dropout(out.squeeze(1))
        s["hidden"], s["input_feed"] = hidden, out
        if cell is not None:
            s["cell"] = cell
        return out, attn.squeeze(1)
