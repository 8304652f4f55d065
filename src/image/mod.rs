//! Worker images: packing an executable (with its loader and libraries, `bundle`) into a
//! `FROM scratch` image through the engine, and finding the stale ones.

pub mod bundle;
pub mod pack;
pub mod stale;

pub use pack::{
    PackError, PackSpec, PackedImage, Rootfs, build_image_from_dir_tar, ensure_image, pack_image, write_rootfs,
};
pub use stale::{ImageRemoval, StaleImage, remove_images, stale_images};
