"""The bundled synthetic scenes of coloured shapes, as one plug-in of the core captioner.

Everything that knows colours, shapes, counts or phrases lives here: the scene generator (``world``, ``shapes``:
``python -m captioner.scenes.shapes``), its caption grammar (``grammar``), object boxes per grid cell
(``grounding``), the scene metrics (``metrics``), and the counting devices that registered into the core's seams
(``plugin``): look-alike channels, count head and mask, inhibition of return (``extension``), number-last phrase
order and singular nouns (``phrase_order``), the repeat penalty, count check and phrase merge decoding rules.

Importing this package registers the plug-in as ``"scenes"``; a checkpoint whose config names it imports it.
"""

from captioner.plugins import register
from captioner.scenes.plugin import ScenesPlugin

register(ScenesPlugin())
