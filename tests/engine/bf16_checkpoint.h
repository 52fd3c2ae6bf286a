// A bf16 checkpoint for tests of bf16 weight paths: the "tiny" preset written as bf16 into a
// temporary directory that lives as long as the object.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/model/make_model.h"

namespace pdserve::testing {

class Bf16Checkpoint {
 public:
  explicit Bf16Checkpoint(const std::string& tag)
      : dir_(std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(getpid()))) {
    engine::MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 5;
    o.dtype = engine::DType::kBF16;
    o.out_dir = dir_.string();
    status_ = engine::make_model(o);
  }
  ~Bf16Checkpoint() { std::filesystem::remove_all(dir_); }
  const Status& status() const { return status_; }
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  Status status_;
};

}  // namespace pdserve::testing
