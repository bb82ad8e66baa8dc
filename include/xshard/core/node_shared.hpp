#pragma once
/// \file
/// `node_shared<M>`: mesh type M whose tensors keep their shards in node storage (a
/// shared-memory arena, comm/node_arena.hpp), so that redistributions among the ranks of a
/// node copy each byte once, straight from the source shard into the destination shard.

#include <xshard/comm/node_arena.hpp>
#include <xshard/core/mesh.hpp>

namespace xshard {

/// Mesh type M, with the shards of every tensor on it allocated by `node_allocator`: in the
/// node arena a `node_storage` opened, else on the heap (no arena, or it is full: the
/// tensors work the same, their redistributions copy through staging windows). Everything
/// else is M's: its constructors, axes and communicators, and it converts to M.
///
/// Meshes that library code makes from a mesh (a pipeline stage's, a sub-mesh) are of the
/// base type M: their tensors live on the heap.
///
///     using M = xshard::node_shared<xshard::mesh<"dp", "mp">>;
///     xshard::node_storage storage(xshard::communicator::world(), 1 << 30);
///     M m({2, auto_size}); // shards of tensors on m in the arena
template <mesh_type M>
class node_shared : public M {
public:
    using M::M;
    /// The same mesh (sharing M's communicators), its tensors' shards in node storage.
    explicit node_shared(const M& m)
        : M(m) {}

    template <class T>
    using shard_allocator = node_allocator<T>;
};

} // namespace xshard
