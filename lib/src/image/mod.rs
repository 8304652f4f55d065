//! Worker images: packing an executable (with its loader and libraries, `bundle`) into a
//! `FROM scratch` image through the engine, and finding the stale ones.
//!
//! Nothing grows without bound on the host: the host bundles of executables that were
//! rebuilt or removed, or not used for a week, are pruned whenever a bundle is prepared
//! ([`bundle::prune`]), and packing a tag again removes the image it pointed to before
//! once that image has no tag left and no container uses it.

pub mod bundle;
pub mod init_image;
pub mod pack;
pub mod stale;
mod tarball;

pub use init_image::pack_init_image;
pub use pack::{
    PackError, PackSpec, PackedImage, Rootfs, build_image_from_dir_tar, ensure_image, pack_image, write_rootfs,
};
pub use stale::{ImageRemoval, StaleImage, remove_images, stale_images};
