"""captune_torch: a captune run continued under PyTorch DDP.

It reads a captune captioner checkpoint (captune's own decoder, a GPT-2
ClipCap or an LSTM captioner), trains it with the same model, losses and
optimiser as captune, and writes captune's run-folder format, so `captune
app --follow`, `eval`, `inspect` and `train --resume` work on the result.
"""

from .checkpoint import Checkpoint, load_checkpoint
from .model import Captioner

__all__ = ["Captioner", "Checkpoint", "load_checkpoint"]
