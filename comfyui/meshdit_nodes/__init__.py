"""meshdit's ComfyUI nodes: the graph's prompt and settings go to a `meshdit serve` (which runs the model over
all its GPUs), the result comes back as ComfyUI's IMAGE (and a video's frames, MP4 path and audio).

Install: copy or symlink this folder into ComfyUI's custom_nodes/ (docs/comfyui.md). It needs nothing beyond
what ComfyUI has (standard library, torch, numpy, PIL)."""
from .nodes import (MeshditImageEdit, MeshditImageToVideo, MeshditLora, MeshditSettings, MeshditTextToImage,
                    MeshditTextToVideo)

NODE_CLASS_MAPPINGS = {
    "MeshditSettings": MeshditSettings,
    "MeshditLora": MeshditLora,
    "MeshditTextToImage": MeshditTextToImage,
    "MeshditImageEdit": MeshditImageEdit,
    "MeshditTextToVideo": MeshditTextToVideo,
    "MeshditImageToVideo": MeshditImageToVideo,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "MeshditSettings": "meshdit Settings",
    "MeshditLora": "meshdit LoRA",
    "MeshditTextToImage": "meshdit Text to Image",
    "MeshditImageEdit": "meshdit Image Edit",
    "MeshditTextToVideo": "meshdit Text to Video",
    "MeshditImageToVideo": "meshdit Image to Video",
}
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
