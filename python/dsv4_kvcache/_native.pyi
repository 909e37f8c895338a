from typing import Any, Dict, List, Literal, Optional, Tuple

import torch

# Where a 584/528/288 B record's scales go: "planar" (the seed's: a page's
# values, then its scales) or "per_token" (vLLM 0.34.0's).
RecordOrder = Literal["planar", "per_token"]
IndexerKOrder = Literal["row_major", "tiled", "preshuffled"]

__version__: str

def fused_save_compress_norm(
    kv_score: torch.Tensor,
    positions: torch.Tensor,
    state_cache: Optional[torch.Tensor],
    slot_mapping: torch.Tensor,
    query_start_loc: Optional[torch.Tensor],
    token_to_req_indices: Optional[torch.Tensor],
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
    latent_out: torch.Tensor,
    prev_rows: Optional[torch.Tensor] = None,
    prev_row_indices: Optional[torch.Tensor] = None,
) -> None: ...
def rope_quant_insert(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    fp8_scale: Optional[torch.Tensor] = None,
    *,
    sanitize: Optional[bool] = None,
    record_order: RecordOrder = "planar",
) -> None: ...
def save_ring_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, state_cache: torch.Tensor) -> None: ...
def gather_dequant(
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    slot_mapping: Optional[torch.Tensor] = None,
    *,
    block_table: Optional[torch.Tensor] = None,
    cu_seq_lens: Optional[torch.Tensor] = None,
    seq_starts: Optional[torch.Tensor] = None,
    fp8_scale: Optional[torch.Tensor] = None,
    record_order: RecordOrder = "planar",
) -> None: ...
def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    use_fp4_cache: bool,
    mxfp4_n_per_tile: int = 0,
    *,
    k_order: IndexerKOrder = "row_major",
    mx_scale: bool = False,
) -> None: ...
def fused_compress_insert(
    kv_score: torch.Tensor,
    positions: torch.Tensor,
    state_cache: Optional[torch.Tensor],
    slot_mapping: torch.Tensor,
    query_start_loc: Optional[torch.Tensor],
    token_to_req_indices: Optional[torch.Tensor],
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
    latent_out: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_slot_mapping: torch.Tensor,
    fp8_scale: Optional[torch.Tensor] = None,
    prev_rows: Optional[torch.Tensor] = None,
    prev_row_indices: Optional[torch.Tensor] = None,
    *,
    skip_latent_out: bool = False,
    sanitize: Optional[bool] = None,
    record_order: RecordOrder = "planar",
) -> None: ...
def _take_skip_counts(device_type: str, index: int) -> Tuple[int, int, int]: ...
def _init(device_type: str, index: int) -> str: ...
def _features() -> Tuple[bool, bool]: ...
def info() -> Dict[str, Any]: ...
def _read_tensors(*tensors: torch.Tensor, exchange: bool = True) -> None: ...
def _reference(name: str, *args: object, **kwargs: object) -> Tuple[int, int, int]: ...
def _read_tensor(tensor: torch.Tensor, exchange: bool = True) -> Tuple[str, str, int, int, List[int], List[int]]: ...
def _reads_by_exchange() -> bool: ...
