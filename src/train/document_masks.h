// Megatron's per-sample masks for documents packed into one sample (training.py's
// get_ltor_masks_and_position_ids): the token after an end-of-document token starts a new
// document, whose positions restart at 0 (--reset-position-ids) and which cannot attend
// to the documents before it (--reset-attention-mask); eod tokens carry no loss
// (--eod-mask-loss).
#pragma once

#include <cstdint>

namespace omni {

struct DocumentMaskOptions {
  int32_t eod = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool any() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
};

// tokens [batch, seq] -> positions and key_start [batch, seq] (the first key each row may
// attend) and loss_mask [batch, seq].
void document_masks(const int32_t* tokens, int batch, int seq, const DocumentMaskOptions& o,
                    int32_t* positions, int32_t* key_start, float* loss_mask);

}  // namespace omni
