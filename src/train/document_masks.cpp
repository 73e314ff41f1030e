#include "train/document_masks.h"

#include <cstddef>

namespace omni {

void document_masks(const int32_t* tokens, int batch, int seq, const DocumentMaskOptions& o,
                    int32_t* positions, int32_t* key_start, float* loss_mask) {
  for (int b = 0; b < batch; ++b) {
    const int32_t* t = tokens + static_cast<size_t>(b) * seq;
    int doc_start = 0;  // index of the first token of the current document
    for (int i = 0; i < seq; ++i) {
      const size_t n = static_cast<size_t>(b) * seq + i;
      positions[n] = o.reset_position_ids ? i - doc_start : i;
      key_start[n] = o.reset_attention_mask ? doc_start : 0;
      loss_mask[n] = o.eod_mask_loss && t[i] == o.eod ? 0.0f : 1.0f;
      if (t[i] == o.eod) doc_start = i + 1;  // the eod itself ends its document
    }
  }
}

}  // namespace omni
