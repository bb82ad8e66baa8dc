#pragma once
/// \file
/// The definitions of what search/networks.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/networks.hpp>

namespace xshard {

XSHARD_DECL network_spec mlp_network(const std::vector<std::size_t>& widths, std::size_t batch) {
    if (widths.size() < 2)
        throw std::invalid_argument("xshard: an mlp needs at least two widths (in and out)");
    network_spec n;
    n.batch = batch;
    n.description = "mlp:";
    for (std::size_t i = 0; i < widths.size(); ++i) {
        if (widths[i] == 0)
            throw std::invalid_argument("xshard: an mlp's widths must be positive");
        n.description += (i ? "," : "") + std::to_string(widths[i]);
    }
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
        if (i > 0)
            n.ops.push_back(
                {"relu" + std::to_string(i), op_kind::elementwise, widths[i], widths[i], false, 1});
        n.ops.push_back(
            {"linear" + std::to_string(i + 1), op_kind::linear, widths[i], widths[i + 1], true, 1});
    }
    return n;
}

XSHARD_DECL network_spec transformer_network(std::size_t layers, std::size_t hidden,
                                             std::size_t heads, std::size_t seq, std::size_t vocab,
                                             std::size_t batch) {
    if (layers == 0 || hidden == 0 || heads == 0 || seq == 0 || vocab == 0)
        throw std::invalid_argument("xshard: a transformer's sizes must be positive");
    if (hidden % heads != 0)
        throw std::invalid_argument("xshard: a transformer's heads (" + std::to_string(heads) +
                                    ") must divide its hidden size (" + std::to_string(hidden) +
                                    ")");
    network_spec n;
    n.batch = batch;
    n.seq = seq;
    n.description = "transformer:" + std::to_string(layers) + "," + std::to_string(hidden) + "," +
                    std::to_string(heads) + "," + std::to_string(seq) + "," + std::to_string(vocab);
    n.ops.push_back({"embedding", op_kind::embedding, vocab, hidden, false, 1});
    for (std::size_t l = 0; l < layers; ++l) {
        const std::string b = "block" + std::to_string(l) + ".";
        n.ops.push_back({b + "norm1", op_kind::normalization, hidden, hidden, true, 1});
        n.ops.push_back({b + "qkv", op_kind::linear, hidden, 3 * hidden, true, 1});
        n.ops.push_back({b + "attention", op_kind::attention, 3 * hidden, hidden, false, heads});
        n.ops.push_back({b + "proj", op_kind::linear, hidden, hidden, true, 1});
        n.ops.push_back({b + "norm2", op_kind::normalization, hidden, hidden, true, 1});
        n.ops.push_back({b + "up", op_kind::linear, hidden, 4 * hidden, true, 1});
        n.ops.push_back({b + "gelu", op_kind::elementwise, 4 * hidden, 4 * hidden, false, 1});
        n.ops.push_back({b + "down", op_kind::linear, 4 * hidden, hidden, true, 1});
    }
    n.ops.push_back({"norm", op_kind::normalization, hidden, hidden, true, 1});
    n.ops.push_back({"head", op_kind::linear, hidden, vocab, false, 1});
    return n;
}

} // namespace xshard

