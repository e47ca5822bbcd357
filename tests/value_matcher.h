// Checks a tvc::io::Value read from a .pth file against the description Python printed of the
// same object (tools/pth_fixtures.py, tools/checkpoint_fixtures.py).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "test_helpers.h"
#include "tvc/serialize.h"

namespace tvc::test {

// The bytes of t's elements in row-major order, as hexadecimal.
inline std::string hex_of_tensor(const Tensor& t) { return hex(tensor_bytes(t)); }

// Structure, numbers exactly, tensors' dtype, geometry and bytes, which tensors share a storage,
// and opaque objects as pickle recorded them. Failures are recorded with GoogleTest.
struct ValueMatcher {
  std::map<int64_t, const Storage*> by_id;
  std::map<const Storage*, int64_t> by_storage;

  void match(const io::Value& v, const nlohmann::json& d, const std::string& path) {
    using Kind = io::Value::Kind;
    SCOPED_TRACE(path);
    if (d.contains("tensor")) {
      ASSERT_EQ(v.kind(), Kind::Tensor);
      const Tensor& t = v.to_tensor();
      const nlohmann::json& e = d["tensor"];
      EXPECT_EQ(std::string("torch.") + dtype_name(t.dtype()), e["dtype"].get<std::string>());
      EXPECT_EQ(t.shape(), e["shape"].get<Shape>());
      EXPECT_EQ(t.strides(), e["stride"].get<Shape>());
      EXPECT_EQ(t.storage_offset(), e["offset"].get<int64_t>());
      EXPECT_EQ(t.storage()->nbytes(), e["storage_size"].get<size_t>() * t.element_size());
      EXPECT_EQ(t.requires_grad(), e["requires_grad"].get<bool>());
      EXPECT_EQ(hex_of_tensor(t), e["hex"].get<std::string>());
      int64_t id = e["storage"].get<int64_t>();
      auto [a, new_id] = by_id.emplace(id, t.storage().get());
      auto [b, new_storage] = by_storage.emplace(t.storage().get(), id);
      EXPECT_EQ(a->second, t.storage().get()) << "storage " << id << " is not shared";
      EXPECT_EQ(b->second, id) << "tensors of different torch storages share a tvc storage";
    } else if (d.contains("dict")) {
      ASSERT_EQ(v.kind(), Kind::Dict);
      EXPECT_EQ(v.ordered(), d["ordered"].get<bool>());
      items(v.items(), d["dict"], path);
    } else if (d.contains("list") || d.contains("tuple") || d.contains("set")) {
      const char* kind = d.contains("list") ? "list" : d.contains("tuple") ? "tuple" : "set";
      ASSERT_STREQ(v.kind_name(), kind);
      elements(v.elements(), d[kind], path);
    } else if (d.contains("object")) {
      ASSERT_EQ(v.kind(), Kind::Object) << "a " << v.kind_name() << ", expected " << d.dump().substr(0, 200);
      const io::OpaqueObject& o = v.object();
      const nlohmann::json& e = d["object"];
      EXPECT_EQ(o.global, e["global"].get<std::string>());
      const char* made = o.made == io::OpaqueObject::Made::New    ? "new"
                         : o.made == io::OpaqueObject::Made::Call ? "call"
                                                                  : "global";
      EXPECT_EQ(made, e["made"].get<std::string>());
      elements(o.args, e["args"], path + ".args");
      match(o.state, e["state"], path + ".state");
      elements(o.appended, e["appended"], path + ".appended");
      items(o.set_items, e["set_items"], path + ".set_items");
    } else if (d.contains("bytes")) {
      ASSERT_EQ(v.kind(), Kind::Bytes);
      const std::string& b = v.to_string();
      EXPECT_EQ(hex(std::vector<uint8_t>(b.begin(), b.end())), d["bytes"].get<std::string>());
    } else if (d.contains("int")) {
      ASSERT_EQ(v.kind(), Kind::Int);
      EXPECT_EQ(v.to_int(), d["int"].get<int64_t>());
    } else if (d.contains("float")) {
      ASSERT_EQ(v.kind(), Kind::Float);
      EXPECT_EQ(v.to_float(), d["float"].get<double>());
    } else if (d.contains("str")) {
      ASSERT_EQ(v.kind(), Kind::String);
      EXPECT_EQ(v.to_string(), d["str"].get<std::string>());
    } else if (d.contains("bool")) {
      ASSERT_EQ(v.kind(), Kind::Bool);
      EXPECT_EQ(v.to_bool(), d["bool"].get<bool>());
    } else {
      ASSERT_TRUE(d.contains("none")) << d.dump();
      EXPECT_TRUE(v.is_none()) << "a " << v.kind_name();
    }
  }

 private:
  void elements(const std::vector<io::Value>& values, const nlohmann::json& d, const std::string& path) {
    ASSERT_EQ(values.size(), d.size()) << path;
    for (size_t i = 0; i < values.size(); ++i) match(values[i], d[i], path + "." + std::to_string(i));
  }
  void items(const io::Value::Items& values, const nlohmann::json& d, const std::string& path) {
    ASSERT_EQ(values.size(), d.size()) << path;
    for (size_t i = 0; i < values.size(); ++i) {
      match(values[i].first, d[i][0], path + "[key]");
      match(values[i].second, d[i][1], path + "." + d[i][0].dump());
    }
  }
};

}  // namespace tvc::test
